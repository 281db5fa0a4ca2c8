-- adaptive_record.lua: counts one order outcome toward adaptive admission.
-- KEYS[1] the queue's adaptive HASH (<prefix>:{<queue>}:adaptive): per
--         window w, fields "w:<bucket>" (commits per commit-time bucket)
--         and "w:f" (rollbacks), next to the last decision's fields.
-- ARGV[1] window length, ms  ARGV[2] a bucket index, or 'f' for a rollback
-- ARGV[3] how long the hash lives without a new sample, ms
-- Returns the window counted in (store clock ms / window length).
-- Atomic so the window is taken from the store clock of the very call
-- that counts in it: every instance counts in the same windows whatever
-- its own clock says.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local window = math.floor(now / tonumber(ARGV[1]))
redis.call('HINCRBY', KEYS[1], window .. ':' .. ARGV[2], 1)
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return window
