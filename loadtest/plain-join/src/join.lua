-- join.lua: the baseline's one join, atomic as waitroom's: the look-up,
-- the entry number and the add in one step (else two joins of one user
-- could both be numbered).
-- KEYS[1] the line (ZSET user -> entry number)  KEYS[2] the entry counter
-- ARGV[1] the user.
-- Returns {created (1/0), rank, waiting}.
-- Also loaded by loadtest/enter-many-cost.py, as the baseline's call.
local seq = redis.call('ZSCORE', KEYS[1], ARGV[1])
local created = 0
if not seq then
  seq = redis.call('INCR', KEYS[2])
  redis.call('ZADD', KEYS[1], seq, ARGV[1])
  created = 1
end
return {created, redis.call('ZRANK', KEYS[1], ARGV[1]), redis.call('ZCARD', KEYS[1])}
