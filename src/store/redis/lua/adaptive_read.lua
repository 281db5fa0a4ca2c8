-- adaptive_read.lua: what the adaptive controller decides on.
-- KEYS[1] the queue's adaptive HASH (see adaptive_record.lua)
-- ARGV[1] window length, ms  ARGV[2] number of commit-time buckets
-- ARGV[3] most windows one decision's evidence spans
-- Returns {now ms, last complete window, first window of the evidence,
--          {bucket counts...}, rollbacks,
--          {window, rate, holdUntil, verdict, p95, commits, failures, at,
--           windowMs, evidenceFrom}}
-- (state fields false before the first decision). The counts are summed
-- over the evidence: from the last decision's evidenceFrom (no more than
-- ARGV[3] windows back; the last window alone when the length changed)
-- to the last complete window.
-- Atomic so the window read is the one the store clock says is complete,
-- and the samples and the last decision come from the same moment.
-- Cost: one HMGET of at most ARGV[3] x (ARGV[2] + 1) fields, once per
-- window per queue.
local len, nbuckets, span = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local window = math.floor(now / len) - 1
local state = redis.call('HMGET', KEYS[1], 'window', 'rate', 'holdUntil', 'verdict',
  'p95', 'commits', 'failures', 'at', 'windowMs', 'evidenceFrom')
local from = window
if state[9] and tonumber(state[9]) == len and state[10] then
  from = math.min(math.max(tonumber(state[10]), window - span + 1), window)
end
local fields = {}
for w = from, window do
  for i = 0, nbuckets - 1 do
    fields[#fields + 1] = w .. ':' .. i
  end
  fields[#fields + 1] = w .. ':f'
end
local counts = redis.call('HMGET', KEYS[1], unpack(fields))
local buckets, failures = {}, 0
for i = 1, nbuckets do
  buckets[i] = 0
end
local per = nbuckets + 1
for k = 1, #counts do
  local i = (k - 1) % per + 1
  local n = tonumber(counts[k] or '0')
  if i == per then
    failures = failures + n
  else
    buckets[i] = buckets[i] + n
  end
end
return {now, window, from, buckets, failures, state}
