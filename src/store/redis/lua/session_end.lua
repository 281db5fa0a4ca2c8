-- session_end.lua: ends sessions: those past their deadline (idle), or
-- one an operator names.
-- KEYS[1..8], ARGV[1..2]: see common.lua
-- KEYS[9]  sessions       ZSET id -> deadline ms (session_start.lua)
-- KEYS[10] sessions:info  HASH id -> "<expiry ms> <user>"
-- KEYS[11] sessions:users HASH user -> id
-- KEYS[12] sessions:ended STREAM of ended sessions (id, exp): what every
--          instance reads into its local set of refused passes
-- ARGV[3] '' to end the sessions past their deadline (at most 500 a call),
--         or the id of one session to end now
-- ARGV[4] how long ended entries are kept, ms (the longest session life)
-- ARGV[5] hold ms: how long the slot stays taken after the end is logged,
--         so every instance (reading the log once a second) refuses the
--         pass before admission gives the slot to someone else
-- Returns the number of sessions ended.
-- Atomic so a session leaves the live set, sets its user's slot to free
-- and is logged as ended in one step: no instance can count it live after
-- its slot was given away, nor miss it in the log.
-- Cost: O(ended × log n), bounded by the 500.
local only, keep, hold = ARGV[3], ARGV[4] + 0, ARGV[5] + 0
local now = now_ms()

local function finish(id)
  local info = redis.call('HGET', KEYS[10], id)
  redis.call('ZREM', KEYS[9], id)
  if not info then
    return 0
  end
  local exp, user = info:match('^(%d+) (.+)$')
  redis.call('HDEL', KEYS[10], id)
  if redis.call('HGET', KEYS[11], user) == id then
    redis.call('HDEL', KEYS[11], user)
  end
  -- The slot is the session's unless the user holds a token again (a new
  -- admission after a new join): that one keeps it. Otherwise it frees
  -- hold ms from now (admit.lua drops it then).
  if not token_get(user) then
    redis.call('ZADD', K.active, 'XX', now + hold, user)
  end
  redis.call('XADD', KEYS[12], 'MINID', '~', string.format('%d', now - keep), '*',
    'id', id, 'exp', exp)
  return 1
end

if only ~= '' then
  if not redis.call('ZSCORE', KEYS[9], only) then
    return 0
  end
  return finish(only)
end
local ended = 0
local idle = redis.call('ZRANGE', KEYS[9], '-inf', now, 'BYSCORE', 'LIMIT', 0, 500)
for _, id in ipairs(idle) do
  ended = ended + finish(id)
end
return ended
