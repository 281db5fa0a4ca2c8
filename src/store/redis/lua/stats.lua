-- stats.lua: a queue's counts for operators.
-- KEYS, ARGV[1..2]: see common.lua.
-- Returns {waiting, active (unexpired token holders), pass, paused (1/0)}.
-- A script so expired holders are dropped from the active set before it is
-- counted, with the store clock.
expire_active(now_ms())
local waiting, pass = totals()
return {waiting, redis.call('ZCARD', K.active), pass, redis.call('EXISTS', K.paused)}
