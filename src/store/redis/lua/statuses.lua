-- statuses.lua: many users' standings in one round trip (stream refreshes).
-- KEYS, ARGV[1..2]: see common.lua.   ARGV[3..] users
-- Returns a list of describe() rows, one per user, in argument order.
-- Atomic so all rows come from one instant, with one ZCARD for all.
local now = now_ms()
local total, pass = totals()
local out = {}
for i = 3, #ARGV do
  out[#out + 1] = describe(ARGV[i], now, 0, total, pass)
end
return out
