-- adaptive_apply.lua: stores one window's adaptive decision, once.
-- KEYS[1] the queue's adaptive HASH (see adaptive_record.lua)
-- KEYS[2] the queue's settings HASH (see put_settings.lua)
-- ARGV[1] window decided  ARGV[2] rate per second  ARGV[3] holdUntil
-- ARGV[4] verdict  ARGV[5] p95 ms ('' none)  ARGV[6] commits
-- ARGV[7] rollbacks  ARGV[8] new batch ('' unchanged)
-- ARGV[9] the settings version the decision was made on
-- ARGV[10] how long the adaptive hash lives, ms  ARGV[11] window length, ms
-- ARGV[12] the first window whose orders count toward the next decision
-- Returns 1 if stored, 0 if a decision reaching as far in store time
-- ((window + 1) x length: comparable when the length changes) was stored
-- already, or the settings changed since they were read.
-- Atomic because every instance may decide the same window: the check and
-- the write must be one step, or two instances could both cut the rate
-- for one slow window.
local window, len = tonumber(ARGV[1]), tonumber(ARGV[11])
local decided = redis.call('HMGET', KEYS[1], 'window', 'windowMs')
if decided[1] and (tonumber(decided[1]) + 1) * tonumber(decided[2] or '1') >= (window + 1) * len then
  return 0
end
local version = redis.call('HGET', KEYS[2], 'version')
if not version or version ~= ARGV[9] then
  return 0
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if ARGV[8] ~= '' and redis.call('HGET', KEYS[2], 'batch') ~= ARGV[8] then
  redis.call('HSET', KEYS[2], 'batch', ARGV[8], 'updatedAt', now)
  redis.call('HINCRBY', KEYS[2], 'version', 1)
end
redis.call('HSET', KEYS[1], 'window', window, 'windowMs', len, 'rate', ARGV[2], 'holdUntil', ARGV[3],
  'verdict', ARGV[4], 'p95', ARGV[5], 'commits', ARGV[6], 'failures', ARGV[7], 'at', now,
  'evidenceFrom', ARGV[12])
-- Samples of windows decided are done with; those still gathered for the
-- next decision stay.
local from = tonumber(ARGV[12])
local stale = {}
for _, field in ipairs(redis.call('HKEYS', KEYS[1])) do
  local w = string.match(field, '^(%d+):')
  if w and tonumber(w) < from then
    stale[#stale + 1] = field
  end
end
if #stale > 0 then
  redis.call('HDEL', KEYS[1], unpack(stale))
end
redis.call('PEXPIRE', KEYS[1], ARGV[10])
return 1
