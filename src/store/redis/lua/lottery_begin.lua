-- lottery_begin.lua: the first step of a lottery draw: freezes the
-- pre-queue the caller computed the order from, reserves the drawn
-- entries' ids and opens an empty stage (lottery_stage.lua fills it in
-- chunks, lottery_commit.lua puts it in line in one short step).
-- KEYS[1..8], ARGV[1..2]: see common.lua. All in the queue's hash tag:
-- KEYS[9]  the lottery HASH, KEYS[10] the pre-queue HASH (see
--          lottery_schedule.lua); while a draw is staged the lottery has
--          state 'drawing' and the fields draw (its id), base (the drawn
--          entries take ids base+1 .. base+n in drawn order), n (the
--          frozen pre-queue's size), staged (order positions staged so
--          far) and stageAt (store ms of the stage's last progress)
-- KEYS[11] the published list (STRING, see lottery_commit.lua)
-- KEYS[12] the stage's line (ZSET user -> entry id, to the line at commit)
-- KEYS[13] the stage's presence (ZSET user -> ms, to presence at commit)
-- KEYS[14] the stage's pre-queue (HASH user -> 'preEntry:nonce:entry', the
--          records the pre-queue HASH becomes at commit)
-- KEYS[15] the frozen entries that left while staged (SET of users)
-- KEYS[16] the stage's published list (STRING, the list at commit)
-- ARGV[3] the draw's id (the caller's, fresh per draw)
-- ARGV[4] the pre-queue version the order was computed from
-- ARGV[5] n, the number of users in the order
-- ARGV[6] where a new entry counter starts (see next_entry)
-- ARGV[7] ms after which another draw's stage without progress is
--         abandoned (its instance died) and replaced by this one
-- ARGV[8] the published list: the sorted fingerprints, one a line
-- Returns {'ok'} when this draw now holds the stage; {'already'} when the
-- draw has run; {'busy'} while another draw's stage makes progress;
-- {'stale'} when there is no lottery, opensAt is still ahead on the store
-- clock, or the pre-queue is not at that version with n entries (nothing
-- staged: read again and retry).
-- Atomic so that of many instances exactly one holds the stage, the
-- version check and the freeze are one step (every later join or leave
-- is applied to the stage as well as to the pre-queue, see
-- lottery_join.lua and lottery_leave.lua), and the block of entry ids is
-- taken in the same step, before any later arrival's id.
local lot, pre = KEYS[9], KEYS[10]
local f = redis.call('HMGET', lot, 'state', 'opensAt', 'version', 'stageAt')
if not f[1] then
  return {'stale'}
end
if f[1] == 'drawn' then
  return {'already'}
end
local now = now_ms()
if f[1] == 'drawing' then
  if now - tonumber(f[4]) <= tonumber(ARGV[7]) then
    return {'busy'}
  end
  -- Abandoned: its stage goes (UNLINK frees it off the main thread), and
  -- the pre-queue, which every change kept current, is drawn again.
  redis.call('UNLINK', KEYS[12], KEYS[13], KEYS[14], KEYS[15], KEYS[16])
  redis.call('HSET', lot, 'state', 'scheduled')
  redis.call('HDEL', lot, 'draw', 'base', 'n', 'staged', 'stageAt')
end
local n = tonumber(ARGV[5])
if now < tonumber(f[2]) or f[3] ~= ARGV[4] or redis.call('HLEN', pre) ~= n then
  return {'stale'}
end
redis.call('SET', K.seq, ARGV[6], 'NX')
local base = redis.call('INCRBY', K.seq, n) - n
redis.call('HSET', lot, 'state', 'drawing', 'draw', ARGV[3], 'base', base, 'n', n,
  'staged', 0, 'stageAt', now)
redis.call('SET', KEYS[16], ARGV[8])
return {'ok'}
