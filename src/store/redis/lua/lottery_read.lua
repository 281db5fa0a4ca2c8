-- lottery_read.lua: reads a queue's lottery, and with ARGV[1] = '1' its
-- whole pre-queue as of the same moment.
-- Not prefixed with common.lua: it touches only the lottery's own keys.
-- KEYS[1] the lottery HASH, KEYS[2] the pre-queue HASH (lottery_schedule.lua)
-- ARGV[1] '1' to include the pre-queue, else '0'
-- Returns {} without a lottery; else {opensAt, seed, commitment, state,
-- version, entries, ms since a staged draw last moved on (-1: none)}
-- followed, with ARGV[1] = '1', by user, record pairs.
-- Atomic (one script rather than two reads) so the version read is the
-- version of exactly the entries read: a draw computed from them is
-- applied only if the pre-queue is still that one.
local lot, pre = KEYS[1], KEYS[2]
local f = redis.call('HMGET', lot, 'opensAt', 'seed', 'commitment', 'state', 'version')
if not f[1] then
  return {}
end
local out = {f[1], f[2], f[3], f[4], f[5], tostring(redis.call('HLEN', pre)), '-1'}
if f[4] == 'drawing' then
  -- How long the staged draw has not moved on (store clock), so callers
  -- leave a live one alone and replace an abandoned one.
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  out[7] = tostring(now - tonumber(redis.call('HGET', lot, 'stageAt')))
end
if ARGV[1] == '1' then
  local all = redis.call('HGETALL', pre)
  for i = 1, #all do
    out[#out + 1] = all[i]
  end
end
return out
