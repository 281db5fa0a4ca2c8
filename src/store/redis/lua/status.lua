-- status.lua: one user's standing, token first; optionally marks them seen.
-- KEYS (KEYS[9] the user's token key), ARGV[1..2]: see common.lua.   ARGV[3] user   ARGV[4] touch (1/0)
-- Returns describe(): {kind, created(0), rank, entry, token, ttl_ms, entered_at, total, pass}.
-- Atomic so the token look-up and the rank are read at one instant: read
-- apart, a user admitted in between would look NOT_ENTERED.
local user = ARGV[3]
local now = now_ms()
if ARGV[4] == '1' then
  redis.call('ZADD', K.seen, 'XX', now, user)
end
local total, pass = totals()
return describe(user, K.token, now, 0, total, pass)
