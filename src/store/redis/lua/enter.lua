-- enter.lua: put a user in line, or keep the place or token they have.
-- KEYS (KEYS[9] the user's token key), ARGV[1..2]: see common.lua.
-- ARGV[3] user   ARGV[4] fast-track token   ARGV[5] token TTL ms
-- ARGV[6] batch  ARGV[7] interval ms        ARGV[8] max active (-1 = unlimited)
-- ARGV[9] first entry id, used only if the entry counter does not exist yet
-- Returns describe(): {kind, created, rank, entry, token, ttl_ms, entered_at, total, pass}.
-- A new entry (in line or on the fast track) takes the next entry id; so
-- does a token issued by a version without entry ids, on its holder's next
-- join, so they can be given a ticket for it (rolling upgrades).
-- Atomic because the check and the add must be one step (two concurrent
-- first enters of one user must not both add), the arrival number must be
-- taken in the same step as the add (strict FIFO), and the fast track must
-- spend from the shared budget in the same step as it issues the token (a
-- burst cannot bypass the rate or maxActive). No fast track while paused.
local user = ARGV[3]
local ttl, batch, interval, max_active =
  tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
local now = now_ms()
expire_active(now)

local tokkey = K.token
local has_token = redis.call('EXISTS', tokkey) == 1
if has_token or redis.call('ZSCORE', K.waiting, user) then
  if has_token and redis.call('HEXISTS', tokkey, 'entry') == 0 then
    redis.call('HSET', tokkey, 'entry', next_entry(ARGV[9]))
  end
  redis.call('ZADD', K.seen, 'XX', now, user)
  local total, pass = totals()
  return describe(user, tokkey, now, 0, total, pass)
end

if redis.call('ZCARD', K.waiting) == 0 and room(max_active) > 0
    and redis.call('EXISTS', K.paused) == 0 then
  local level, at = refill(batch, interval, now)
  if level >= 1 then
    save_bucket(level - 1, at)
    issue(tokkey, user, ARGV[4], now, ttl, now, next_entry(ARGV[9]))
    local total, pass = totals()
    return describe(user, tokkey, now, 1, total, pass)
  end
end

local seq = next_entry(ARGV[9])
redis.call('ZADD', K.waiting, seq, user)
redis.call('HSET', K.entered, user, now)
redis.call('ZADD', K.seen, now, user)
local total, pass = totals()
return describe(user, tokkey, now, 1, total, pass)
