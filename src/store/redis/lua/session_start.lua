-- session_start.lua: starts an admitted buyer's session on the protected
-- site, spending their entry token; or finds their live one.
-- KEYS[1..8], ARGV[1..2]: see common.lua; KEYS[9] the user's token HASH
-- KEYS[10] sessions       ZSET id -> deadline ms (idle end, capped by expiry)
-- KEYS[11] sessions:info  HASH id -> "<expiry ms> <user>"
-- KEYS[12] sessions:users HASH user -> id of their live session
-- ARGV[3] user  ARGV[4] the entry id the buyer's ticket stands for
-- ARGV[5] the new session's id  ARGV[6] idle ms  ARGV[7] longest life ms
-- ARGV[8] hold ms: the slot in `active` is scored this long past the
--         deadline, so admission frees it only after session_end.lua has
--         logged the end (or if no instance sweeps at all)
-- Returns {'live', id, expiry} (their session already runs: the same one
-- again), {'started', id, expiry} (new: the token is spent, its slot in
-- `active` is now the session's), or {'not_admitted'} (no live token of
-- that entry).
-- Atomic so the buyer's slot under maxActive passes from the token to the
-- session in one step (admission never sees it free in between), and one
-- token starts one session only.
-- Cost: a handful of O(1)/O(log n) commands.
local user, entry, id = ARGV[3], tonumber(ARGV[4]), ARGV[5]
local idle, life, hold = ARGV[6] + 0, ARGV[7] + 0, ARGV[8] + 0
local now = now_ms()
local live = redis.call('HGET', KEYS[12], user)
if live then
  local deadline = tonumber(redis.call('ZSCORE', KEYS[10], live))
  local info = redis.call('HGET', KEYS[11], live)
  if deadline and deadline > now and info then
    return {'live', live, info:match('^(%d+)')}
  end
end
local t = token_get(user, K.token)
if not t or t.entry ~= entry or t.exp <= now then
  return {'not_admitted'}
end
local exp = now + life
local deadline = math.min(now + idle, exp)
token_del(user, t)
redis.call('ZADD', K.active, deadline + hold, user)
redis.call('ZADD', KEYS[10], deadline, id)
redis.call('HSET', KEYS[11], id, string.format('%d %s', exp, user))
redis.call('HSET', KEYS[12], user, id)
return {'started', id, string.format('%d', exp)}
