-- adaptive_read.lua: what the adaptive controller decides on.
-- KEYS[1] the queue's adaptive HASH (see adaptive_record.lua)
-- ARGV[1] window length, ms  ARGV[2] number of commit-time buckets
-- Returns {now ms, last complete window, {bucket counts...}, rollbacks,
--          {window, rate, holdUntil, verdict, p95, commits, failures, at,
--           windowMs}}
-- (state fields false before the first decision).
-- Atomic so the window read is the one the store clock says is complete,
-- and the samples and the last decision come from the same moment.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local window = math.floor(now / tonumber(ARGV[1])) - 1
local fields = {}
for i = 0, tonumber(ARGV[2]) - 1 do
  fields[#fields + 1] = window .. ':' .. i
end
fields[#fields + 1] = window .. ':f'
local counts = redis.call('HMGET', KEYS[1], unpack(fields))
local buckets = {}
for i = 1, #counts - 1 do
  buckets[i] = tonumber(counts[i] or '0')
end
local state = redis.call('HMGET', KEYS[1], 'window', 'rate', 'holdUntil', 'verdict',
  'p95', 'commits', 'failures', 'at', 'windowMs')
return {now, window, buckets, tonumber(counts[#counts] or '0'), state}
