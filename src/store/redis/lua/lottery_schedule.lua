-- lottery_schedule.lua: schedules a queue's opening with a lottery, moves
-- its opening time, or clears it.
-- Not prefixed with common.lua (it touches only the lottery's own keys),
-- only with the prelude that names PUBLISH (see scripts.rs).
-- KEYS[1] the lottery HASH: opensAt, seed (hex, secret until drawn),
--         commitment (hex SHA-256 of the seed), state ('scheduled',
--         'drawing' while a draw is staged, see lottery_begin.lua, or
--         'drawn'), version (bumped by every pre-queue change), drawnAt
-- KEYS[2] the pre-queue HASH: user -> 'preEntry:nonce[:entry]'
-- ARGV[1] opensAt, ms since the epoch; '' clears the lottery
-- ARGV[2] seed   ARGV[3] its commitment (Redis Lua has no SHA-256, so the
--         caller computes it): used only when no lottery exists yet
-- ARGV[4] the queue's pub/sub channel: a schedule or a move publishes
--         {"kind":"rescheduled","opensAt":<ms>} there, in the same step, so
--         every instance's pre-queue streams show the new time (in the
--         order the moves happened)
-- Returns {'drawn'} (drawn or drawing) or {'not_empty'}, changing nothing; {'cleared', 0|1}
-- for a clear; else {'ok', opensAt, seed, commitment, state, version,
-- entries}.
-- Atomic so a seed once committed is never replaced (a second scheduler
-- only moves the time), and nothing changes once the draw has run, however
-- the calls of many instances interleave with the draw.
local lot, pre = KEYS[1], KEYS[2]
local state = redis.call('HGET', lot, 'state')
-- A draw being staged (lottery_begin.lua) has passed opensAt: too late
-- to move it, as once drawn.
if state == 'drawn' or state == 'drawing' then
  return {'drawn'}
end
if ARGV[1] == '' then
  if not state then
    return {'cleared', 0}
  end
  if redis.call('HLEN', pre) > 0 then
    return {'not_empty'}
  end
  redis.call('DEL', lot)
  return {'cleared', 1}
end
if state then
  redis.call('HSET', lot, 'opensAt', ARGV[1])
else
  redis.call('HSET', lot, 'opensAt', ARGV[1], 'seed', ARGV[2], 'commitment', ARGV[3],
    'state', 'scheduled', 'version', 0)
end
-- ARGV[1] is the decimal the caller formatted from an integer.
redis.call(PUBLISH, ARGV[4], string.format('{"kind":"rescheduled","opensAt":%s}', ARGV[1]))
local f = redis.call('HMGET', lot, 'opensAt', 'seed', 'commitment', 'state', 'version')
return {'ok', f[1], f[2], f[3], f[4], f[5], redis.call('HLEN', pre)}
