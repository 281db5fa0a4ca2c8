-- status.lua: one user's standing, token first; optionally marks them seen;
-- optionally spends one from the user's request budget first.
-- KEYS[1..8], ARGV[1..2]: see common.lua.   KEYS[9] the user's token key
-- KEYS[10] the user's budget (STRING, see gcra.lua; in the queue's hash tag)
-- KEYS[11] the queue's stock HASH (see common.lua)
-- ARGV[3] user   ARGV[4] touch (1/0)
-- ARGV[5] budget period ms (0: no budget)   ARGV[6] budget burst
-- Returns describe(): {kind, created(0), rank, entry, token, ttl_ms, entered_at, total, pass, soldout},
-- or limited('buyer', ms to wait) with nothing read or touched.
-- Atomic so the token look-up and the rank are read at one instant: read
-- apart, a user admitted in between would look NOT_ENTERED; the budget is
-- spent in the same step so a poll stays one round trip and every
-- instance counts against one budget.
local user = ARGV[3]
local now = now_ms()
local period = tonumber(ARGV[5])
if period > 0 then
  local wait = gcra(KEYS[10], now, period, tonumber(ARGV[6]))
  if wait > 0 then
    return limited('buyer', wait)
  end
end
if ARGV[4] == '1' and redis.call('ZSCORE', K.waiting, user) then
  seen_now(user, now)
end
local total, pass = totals()
return with_stock(describe(user, K.token, now, 0, total, pass), KEYS[11])
