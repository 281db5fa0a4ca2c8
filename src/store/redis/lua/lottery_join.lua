-- lottery_join.lua: puts a user in the pre-queue of a scheduled opening,
-- checked against the client address's limits like an ordinary join.
-- KEYS[1..8], ARGV[1..2]: see common.lua. All in the queue's hash tag:
-- KEYS[9]  the user's token key of the earlier layout (common.lua)
-- KEYS[10] the lottery HASH, KEYS[11] the pre-queue HASH (see
--          lottery_schedule.lua)
-- KEYS[12] the client address's join rate (STRING, see gcra.lua)
-- KEYS[13] the client address's places: ZSET user -> entry id (a
--          pre-queue entry counts by its pre-queue entry id)
-- KEYS[14] the stage's line, KEYS[15] its presence, KEYS[16] its records
--          (see lottery_begin.lua): while a draw is staged (state
--          'drawing') a new entry is not in that draw; it is staged as
--          well, with its own entry id (after the drawn block), so the
--          commit puts it in line behind everyone drawn
-- ARGV[3] user   ARGV[4] nonce (random hex, the fingerprint's input)
-- ARGV[5] where a new entry counter starts (see next_entry)
-- ARGV[6] address join period ms (0: none)  ARGV[7] address join burst
-- ARGV[8] places per address (0: none)
-- Returns {'open'} when no lottery waits to be drawn or the user has a
-- place in line or a token (an ordinary join applies, changing nothing
-- here); limited(<'address_places'|'address_joins'>, ms to wait) when a
-- new entry is over the address's limits (nothing changes); else
-- {'pre', created (0|1), preEntry, nonce, entry or -1}. A repeat join (the
-- user is in the pre-queue already) never counts against the address.
-- Atomic so the check of the draw's state and the insertion are one step:
-- an arrival lands either in the pre-queue before the draw reads it (and
-- the draw then covers it, or finds the version changed), in the
-- pre-queue and the stage while a draw is staged (behind the drawn), or
-- in line after the commit; never in a pre-queue already drawn. And the
-- address's count is checked and raised with the insertion, so two
-- instances at an address's last place cannot both add.
local lot, pre, joins_key, places_key = KEYS[10], KEYS[11], KEYS[12], KEYS[13]
local user, nonce = ARGV[3], ARGV[4]
local join_period, join_burst = tonumber(ARGV[6]), tonumber(ARGV[7])
local max_places = tonumber(ARGV[8])
local state = redis.call('HGET', lot, 'state')
if state ~= 'scheduled' and state ~= 'drawing' then
  return {'open'}
end
if redis.call('ZSCORE', K.waiting, user) or token_get(user, K.token) then
  return {'open'}
end
local rec = redis.call('HGET', pre, user)
if rec then
  local p, n, e = rec:match('^(%d+):(%x+):?(%d*)$')
  return {'pre', 0, tonumber(p), n, tonumber(e) or -1}
end
local now = now_ms()
local refused = address_limits(pre, places_key, joins_key, now, max_places, join_period, join_burst, nil)
if refused then
  return refused
end
local entry = next_entry(ARGV[5])
redis.call('HSET', pre, user, string.format('%d:%s', entry, nonce))
redis.call('HINCRBY', lot, 'version', 1)
if max_places > 0 then
  redis.call('ZADD', places_key, entry, user)
  redis.call('PEXPIRE', places_key, 86400000)
end
if state == 'drawing' then
  redis.call('ZADD', KEYS[14], entry, user)
  redis.call('ZADD', KEYS[15], now, user)
  redis.call('HSET', KEYS[16], user, string.format('%d:%s:%d', entry, nonce, entry))
end
return {'pre', 1, entry, nonce, -1}
