-- note_joins.lua: adds one instance's join count to its queue's join rate
-- and sets the queue's challenge switch while the rate is over a threshold.
-- A script of its own (not prefixed with common.lua): it touches only the
-- two keys below, both under the queue's {hash tag}, so one cluster slot.
--
-- KEYS[1] joins      HASH second, current, previous: join requests counted
--                    in the current store second and the one before it
-- KEYS[2] challenge  STRING present (with a PX expiry) while joins need a
--                    solved challenge ("auto" mode)
-- ARGV[1] joins to add (one instance's count since its last call)
-- ARGV[2] threshold: joins per second the busier second must exceed
-- ARGV[3] hold ms: how long the switch stays on after the last time over
-- Returns the ms the switch stays on (0 = off).
--
-- Atomic so that the read of the counts, the roll-over to a new second and
-- the switch are one step for every instance: two instances noting at the
-- same moment can neither lose each other's joins nor roll a second twice.
local t = redis.call('TIME')
local second = tonumber(t[1])
local add = tonumber(ARGV[1])
local threshold = tonumber(ARGV[2])
local hold = tonumber(ARGV[3])

local h = redis.call('HMGET', KEYS[1], 'second', 'current', 'previous')
local at, current, previous = tonumber(h[1]), tonumber(h[2]) or 0, tonumber(h[3]) or 0
if at == second then
  current = current + add
else
  if at == second - 1 then previous = current else previous = 0 end
  current = add
end
redis.call('HSET', KEYS[1], 'second', second, 'current', current, 'previous', previous)
-- Counts older than two seconds mean nothing; an idle queue leaves no key.
redis.call('PEXPIRE', KEYS[1], 5000)

if math.max(current, previous) > threshold then
  redis.call('SET', KEYS[2], '1', 'PX', hold)
end
local left = redis.call('PTTL', KEYS[2])
if left < 0 then return 0 end
return left
