-- lottery_leave.lua: takes a user out of the pre-queue before the draw.
-- Not prefixed with common.lua: it touches only the lottery's own keys.
-- KEYS[1] the lottery HASH, KEYS[2] the pre-queue HASH (lottery_schedule.lua)
-- KEYS[3] the stage's line, KEYS[4] its presence, KEYS[5] its records,
--         KEYS[6] its frozen entries that left (see lottery_begin.lua)
-- ARGV[1] user   ARGV[2] the pre-queue entry id their ticket names
-- While a draw is staged the entry leaves the stage too, and a frozen
-- entry (one the draw's order names) is noted as gone, so the draw skips
-- it: no ghost in line after the commit.
-- Returns 1 if removed; 0, changing nothing, when the draw has run (the
-- user is in line now: an ordinary leave applies) or the entry is not
-- theirs (an old ticket never removes a newer entry).
-- Atomic so the removal and the version bump are one step with the check
-- of the draw's state: a draw computed before the removal then finds the
-- version changed and is not applied.
local lot, pre = KEYS[1], KEYS[2]
local f = redis.call('HMGET', lot, 'state', 'base')
if f[1] ~= 'scheduled' and f[1] ~= 'drawing' then
  return 0
end
local user = ARGV[1]
local rec = redis.call('HGET', pre, user)
if not rec or rec:match('^(%d+):') ~= ARGV[2] then
  return 0
end
redis.call('HDEL', pre, user)
redis.call('HINCRBY', lot, 'version', 1)
if f[1] == 'drawing' then
  redis.call('ZREM', KEYS[3], user)
  redis.call('ZREM', KEYS[4], user)
  redis.call('HDEL', KEYS[5], user)
  if tonumber(ARGV[2]) <= tonumber(f[2]) then
    redis.call('SADD', KEYS[6], user)
  end
end
return 1
