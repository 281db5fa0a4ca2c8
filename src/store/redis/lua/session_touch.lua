-- session_touch.lua: activity of some sessions, reported in a batch.
-- KEYS[1..8], ARGV[1..2]: see common.lua
-- KEYS[9]  sessions      ZSET id -> deadline ms (session_start.lua)
-- KEYS[10] sessions:info HASH id -> "<expiry ms> <user>"
-- ARGV[3] idle ms  ARGV[4] hold ms (session_start.lua)
-- ARGV[5..] the ids seen active since the last report
-- Returns how many deadlines moved: each live session's deadline becomes
-- idle ms from now, never past its expiry; its user's slot in `active`
-- moves with it, hold ms later (admit.lua frees the slot at that score).
-- Atomic so a session past its deadline is never revived (the sweep may
-- have freed its slot already) and the two scores never disagree.
-- Cost: O(ids × log n); an instance sends at most one batch a second.
local idle, hold = ARGV[3] + 0, ARGV[4] + 0
local now = now_ms()
local moved = 0
for i = 5, #ARGV do
  local id = ARGV[i]
  local deadline = tonumber(redis.call('ZSCORE', KEYS[9], id))
  local info = deadline and deadline > now and redis.call('HGET', KEYS[10], id)
  if info then
    local exp, user = info:match('^(%d+) (.+)$')
    local new = math.min(now + idle, tonumber(exp))
    if new > deadline then
      redis.call('ZADD', KEYS[9], new, id)
      redis.call('ZADD', K.active, 'XX', 'GT', new + hold, user)
      moved = moved + 1
    end
  end
end
return moved
