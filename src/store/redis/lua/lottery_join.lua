-- lottery_join.lua: puts a user in the pre-queue of a scheduled opening.
-- KEYS[1..8], ARGV[1..2]: see common.lua. All in the queue's hash tag:
-- KEYS[9]  the user's token key
-- KEYS[10] the lottery HASH, KEYS[11] the pre-queue HASH (see
--          lottery_schedule.lua)
-- ARGV[3] user   ARGV[4] nonce (random hex, the fingerprint's input)
-- ARGV[5] where a new entry counter starts (see next_entry)
-- Returns {'open'} when no lottery waits to be drawn or the user has a
-- place in line or a token (an ordinary join applies, changing nothing
-- here); else {'pre', created (0|1), preEntry, nonce, entry or -1}.
-- Atomic so the check of the draw's state and the insertion are one step:
-- an arrival lands either in the pre-queue before the draw reads it (and
-- the draw then covers it, or finds the version changed) or in line after
-- the draw placed everyone; never in a pre-queue already drawn.
local lot, pre = KEYS[10], KEYS[11]
local user, nonce = ARGV[3], ARGV[4]
if redis.call('HGET', lot, 'state') ~= 'scheduled' then
  return {'open'}
end
if redis.call('EXISTS', K.token) == 1 or redis.call('ZSCORE', K.waiting, user) then
  return {'open'}
end
local rec = redis.call('HGET', pre, user)
if rec then
  local p, n, e = rec:match('^(%d+):(%x+):?(%d*)$')
  return {'pre', 0, tonumber(p), n, tonumber(e) or -1}
end
local entry = next_entry(ARGV[5])
redis.call('HSET', pre, user, string.format('%d:%s', entry, nonce))
redis.call('HINCRBY', lot, 'version', 1)
return {'pre', 1, entry, nonce, -1}
