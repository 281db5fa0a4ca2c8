-- lottery_leave.lua: takes a user out of the pre-queue before the draw.
-- Not prefixed with common.lua: it touches only the lottery's own keys.
-- KEYS[1] the lottery HASH, KEYS[2] the pre-queue HASH (lottery_schedule.lua)
-- ARGV[1] user   ARGV[2] the pre-queue entry id their ticket names
-- Returns 1 if removed; 0, changing nothing, when the draw has run (the
-- user is in line now: an ordinary leave applies) or the entry is not
-- theirs (an old ticket never removes a newer entry).
-- Atomic so the removal and the version bump are one step with the check
-- of the draw's state: a draw computed before the removal then finds the
-- version changed and is not applied.
local lot, pre = KEYS[1], KEYS[2]
if redis.call('HGET', lot, 'state') ~= 'scheduled' then
  return 0
end
local rec = redis.call('HGET', pre, ARGV[1])
if not rec or rec:match('^(%d+):') ~= ARGV[2] then
  return 0
end
redis.call('HDEL', pre, ARGV[1])
redis.call('HINCRBY', lot, 'version', 1)
return 1
