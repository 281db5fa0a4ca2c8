-- lottery_draw.lua: the draw of a scheduled opening: places the whole
-- pre-queue in line, in the order the caller computed from the seed.
-- KEYS[1..8], ARGV[1..2]: see common.lua. All in the queue's hash tag:
-- KEYS[9]  the lottery HASH, KEYS[10] the pre-queue HASH (see
--          lottery_schedule.lua), KEYS[11] the published list (STRING)
-- ARGV[3] the pre-queue version the order was computed from
-- ARGV[4] where a new entry counter starts (see next_entry)
-- ARGV[5] the published list: the sorted fingerprints, one a line
-- ARGV[6..] every pre-queue user, in drawn order
-- Publishes {"kind":"drawn"} on the queue's channel once the line holds
-- the draw, so every instance's pre-queue streams move to their places.
-- Returns {'drawn', n} when this call placed n users; {'already'} when
-- the draw had run; {'stale'} when there is no lottery, opensAt is still
-- ahead on the store clock, or the pre-queue is not exactly the users
-- given at that version (nothing changes: read again and retry).
-- Why a script: Redis Lua has no SHA-256, so the order is computed by the
-- caller, and this step applies it all or nothing: the state check, the
-- version check and the placing are one step, so of many instances that
-- reach opensAt together exactly one places anyone, no arrival slips in
-- between the reading and the placing, and a call lost half-way (Redis
-- killed) leaves either no draw or the whole draw.
local lot, pre, list = KEYS[9], KEYS[10], KEYS[11]
local f = redis.call('HMGET', lot, 'state', 'opensAt', 'version')
if not f[1] then
  return {'stale'}
end
if f[1] == 'drawn' then
  return {'already'}
end
local now = now_ms()
if now < tonumber(f[2]) or f[3] ~= ARGV[3] then
  return {'stale'}
end
local n = #ARGV - 5
if redis.call('HLEN', pre) ~= n then
  return {'stale'}
end
-- Commands take their arguments on Lua's stack: read and write in chunks.
local CHUNK = 1000
local recs, named = {}, {}
for from = 1, n, CHUNK do
  local upto = math.min(n, from + CHUNK - 1)
  local got = redis.call('HMGET', pre, unpack(ARGV, 5 + from, 5 + upto))
  for i = from, upto do
    local user, rec = ARGV[5 + i], got[i - from + 1]
    if not rec or named[user] then
      return {'stale'}
    end
    named[user] = true
    recs[i] = rec
  end
end
-- Fresh entry ids, in drawn order, after every id handed out so far: the
-- line is ordered by entry id, so the drawn order is the line's order and
-- every later arrival queues behind.
redis.call('SET', K.seq, ARGV[4], 'NX')
local base = redis.call('INCRBY', K.seq, n) - n
local line, seen, recs_out = {}, {}, {}
local function flush()
  if #line > 0 then
    redis.call('ZADD', K.waiting, unpack(line))
    redis.call('ZADD', K.seen, unpack(seen))
    redis.call('HSET', pre, unpack(recs_out))
    line, seen, recs_out = {}, {}, {}
  end
end
for i = 1, n do
  local user, id = ARGV[5 + i], base + i
  -- Every entry has the time `now`: one mark at the first entry and at
  -- the first of each later span covers them all (see mark_entry).
  if i == 1 or id % MARK_SPAN == 0 then
    mark_entry(id, now)
  end
  line[#line + 1], line[#line + 2] = id, user
  seen[#seen + 1], seen[#seen + 2] = now, user
  recs_out[#recs_out + 1], recs_out[#recs_out + 2] = user, recs[i] .. string.format(':%d', id)
  if #line >= 2 * CHUNK then
    flush()
  end
end
flush()
redis.call('HSET', lot, 'state', 'drawn', 'drawnAt', now)
redis.call('SET', list, ARGV[5])
publish(cjson.encode({kind = 'drawn'}))
return {'drawn', n}
