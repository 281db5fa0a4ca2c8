-- enter.lua: put a user in line, or keep the place or token they have,
-- checked against the buyer's and the client address's limits.
-- KEYS[1..8], ARGV[1..2]: see common.lua. All in the queue's hash tag:
-- KEYS[9]  the user's token key
-- KEYS[10] the user's request budget (STRING, see gcra.lua)
-- KEYS[11] the client address's join rate (STRING, see gcra.lua)
-- KEYS[12] the client address's places: ZSET user -> entry id
-- KEYS[13] the queue's stock HASH (see common.lua): no fast track past it
-- ARGV[3] user   ARGV[4] fast-track token   ARGV[5] token TTL ms
-- ARGV[6] batch  ARGV[7] interval ms        ARGV[8] max active (-1 = unlimited)
-- ARGV[9] first entry id, used only if the entry counter does not exist yet
-- ARGV[10] budget period ms (0: none)  ARGV[11] budget burst  ARGV[12] grace ms
-- ARGV[13] address join period ms (0: none)  ARGV[14] address join burst
-- ARGV[15] places per address (0: none)
-- Returns describe(): {kind, created, rank, entry, token, ttl_ms, entered_at, total, pass, soldout},
-- or limited(<'buyer'|'address_places'|'address_joins'>, ms to wait), changing nothing.
-- A new entry (in line or on the fast track) takes the next entry id; so
-- does a token issued by a version without entry ids, on its holder's next
-- join, so they can be given a ticket for it (rolling upgrades).
-- Atomic because the check and the add must be one step (two concurrent
-- first enters of one user must not both add), the arrival number must be
-- taken in the same step as the add (strict FIFO), the fast track must
-- spend from the shared budget in the same step as it issues the token (a
-- burst cannot bypass the rate or maxActive), and an address's count must
-- be checked and raised with the add (two instances at an address's last
-- place must not both add). No fast track while paused.
local user = ARGV[3]
local ttl, batch, interval, max_active =
  tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
local budget_period, budget_burst, grace =
  tonumber(ARGV[10]), tonumber(ARGV[11]), tonumber(ARGV[12])
local join_period, join_burst, max_places =
  tonumber(ARGV[13]), tonumber(ARGV[14]), tonumber(ARGV[15])
local now = now_ms()
expire_active(now)

local tokkey = K.token
local has_token = redis.call('EXISTS', tokkey) == 1
if has_token or redis.call('ZSCORE', K.waiting, user) then
  if budget_period > 0 then
    -- A repeat join: counted once its entry is older than the grace.
    local entered = has_token and redis.call('HGET', tokkey, 'enteredAt')
      or redis.call('HGET', K.entered, user)
    entered = tonumber(entered)
    if not entered or now - entered >= grace then
      local wait = gcra(KEYS[10], now, budget_period, budget_burst)
      if wait > 0 then
        return limited('buyer', wait)
      end
    end
  end
  if has_token and redis.call('HEXISTS', tokkey, 'entry') == 0 then
    redis.call('HSET', tokkey, 'entry', next_entry(ARGV[9]))
  end
  redis.call('ZADD', K.seen, 'XX', now, user)
  local total, pass = totals()
  return with_stock(describe(user, tokkey, now, 0, total, pass), KEYS[13])
end

-- A new place: the client address's limits first.
if max_places > 0 and redis.call('ZCARD', KEYS[12]) >= max_places then
  -- Forget places that ended (left, admitted and used, expired, dropped):
  -- a place lasts while its user waits or holds a token with its entry id.
  local held = redis.call('ZRANGE', KEYS[12], 0, -1, 'WITHSCORES')
  for i = 1, #held, 2 do
    local who, entry = held[i], tonumber(held[i + 1])
    local live = tonumber(redis.call('ZSCORE', K.waiting, who)) == entry
      or tonumber(redis.call('HGET', K.tokprefix .. who, 'entry')) == entry
    if not live then
      redis.call('ZREM', KEYS[12], who)
    end
  end
  if redis.call('ZCARD', KEYS[12]) >= max_places then
    return limited('address_places', 10000)
  end
end
if join_period > 0 then
  local wait = gcra(KEYS[11], now, join_period, join_burst)
  if wait > 0 then
    return limited('address_joins', wait)
  end
end

local function counted(entry)
  if max_places > 0 then
    redis.call('ZADD', KEYS[12], entry, user)
    -- Kept a day past the address's last new place; ended places are
    -- forgotten when the count reaches the limit.
    redis.call('PEXPIRE', KEYS[12], 86400000)
  end
end

if redis.call('ZCARD', K.waiting) == 0 and room(max_active) > 0
    and redis.call('EXISTS', K.paused) == 0 and stock_room(KEYS[13]) > 0 then
  local level, at = refill(batch, interval, now)
  if level >= 1 then
    save_bucket(level - 1, at)
    local entry = next_entry(ARGV[9])
    issue(tokkey, user, ARGV[4], now, ttl, now, entry)
    counted(entry)
    local total, pass = totals()
    return with_stock(describe(user, tokkey, now, 1, total, pass), KEYS[13])
  end
end

local seq = next_entry(ARGV[9])
redis.call('ZADD', K.waiting, seq, user)
redis.call('HSET', K.entered, user, now)
redis.call('ZADD', K.seen, now, user)
counted(seq)
local total, pass = totals()
return with_stock(describe(user, tokkey, now, 1, total, pass), KEYS[13])
