-- lottery_commit.lua: the last step of a lottery draw (see
-- lottery_begin.lua): puts the whole stage in line at once and marks the
-- lottery drawn.
-- KEYS[1..16], ARGV[1..2]: as lottery_begin.lua.
-- ARGV[3] the draw's id
-- Publishes {"kind":"drawn"} on the queue's channel, so every instance's
-- pre-queue streams move to their places.
-- Returns {'drawn', n} (n frozen entries placed: the order less those who
-- left meanwhile); {'already'} when the draw has run; {'lost'} when this
-- draw no longer holds the stage or has not staged the whole order;
-- {'stale'} when the order missed a frozen entry (the stage is dropped).
-- Atomic so buyers see the draw all at once: before it, every frozen
-- entry and every later arrival is in the pre-queue; after it, all of
-- them are in line, the drawn in drawn order and the later arrivals
-- behind (their ids come after the drawn block). The step is short
-- whatever the draw's size: the stage's keys are renamed into place
-- (RENAME is O(1)); only a line already holding buyers before the draw is
-- merged entry by entry, the smaller into the larger.
local lot, pre, list = KEYS[9], KEYS[10], KEYS[11]
local stage, stage_seen, stage_pre, left, stage_list = KEYS[12], KEYS[13], KEYS[14], KEYS[15], KEYS[16]
local f = redis.call('HMGET', lot, 'state', 'draw', 'base', 'n', 'staged')
if f[1] == 'drawn' then
  return {'already'}
end
if f[1] ~= 'drawing' or f[2] ~= ARGV[3] or f[4] ~= f[5] then
  return {'lost'}
end
local base, n = tonumber(f[3]), tonumber(f[4])
-- Every user of the pre-queue has a staged record (the frozen ones by the
-- order, later arrivals by their join), or the order missed someone: then
-- the stage is dropped, as lottery_stage.lua drops a wrong one.
if redis.call('HLEN', stage_pre) ~= redis.call('HLEN', pre) then
  redis.call('UNLINK', stage, stage_seen, stage_pre, left, stage_list)
  redis.call('HSET', lot, 'state', 'scheduled')
  redis.call('HDEL', lot, 'draw', 'base', 'n', 'staged', 'stageAt')
  return {'stale'}
end
local now = now_ms()

-- Every entry of the stage enters the line now: one mark at the block's
-- first id and at the first of each later span, and the same for the
-- later arrivals (ids after the block), in id order. The block's later
-- spans hold nobody else (their ids were reserved past the counter), so
-- their first marks go in one HSET per 1000 spans, unread.
mark_entry(base + 1, now)
local block_mark = string.format('0,%d', now)
local spans = {}
for b = math.floor(base / MARK_SPAN) + 1, math.floor((base + n) / MARK_SPAN) do
  spans[#spans + 1], spans[#spans + 2] = '^' .. string.format('%d', b), block_mark
  if #spans >= 2000 then
    redis.call('HSET', K.entered, unpack(spans))
    spans = {}
  end
end
if #spans > 0 then
  redis.call('HSET', K.entered, unpack(spans))
end
local later = redis.call('ZRANGEBYSCORE', stage, '(' .. string.format('%d', base + n), '+inf',
  'WITHSCORES')
for i = 2, #later, 2 do
  mark_entry(tonumber(later[i]), now)
end
-- Marks written out of the joins' order: the next join reads the marks
-- again (see last_mark_key).
redis.call('DEL', last_mark_key())

-- Moves every member of ZSET `from` into ZSET `into`, in parts.
local function move(from, into)
  local PART = 1000
  local at = 0
  while true do
    local got = redis.call('ZRANGE', from, at, at + PART - 1, 'WITHSCORES')
    if #got == 0 then
      return
    end
    local args = {}
    for i = 1, #got, 2 do
      args[#args + 1], args[#args + 2] = got[i + 1], got[i]
    end
    redis.call('ZADD', into, unpack(args))
    at = at + PART
  end
end
-- `staged` becomes `live`: renamed when `live` is empty, else the smaller
-- merged into the larger.
local function place(staged, live)
  local a, b = redis.call('ZCARD', live), redis.call('ZCARD', staged)
  if b == 0 then
    return
  end
  if a > b then
    move(staged, live)
    redis.call('UNLINK', staged)
    return
  end
  if a > 0 then
    move(live, staged)
  end
  redis.call('RENAME', staged, live)
end
place(stage, K.waiting)
place(stage_seen, K.seen)

-- The records: the stage's hold every frozen entry still there (with its
-- drawn id) and every later arrival (with its own), exactly the users the
-- pre-queue holds now.
redis.call('UNLINK', pre)
if redis.call('EXISTS', stage_pre) == 1 then
  redis.call('RENAME', stage_pre, pre)
end
redis.call('RENAME', stage_list, list)
local gone = redis.call('SCARD', left)
redis.call('UNLINK', left)
redis.call('HSET', lot, 'state', 'drawn', 'drawnAt', now)
redis.call('HDEL', lot, 'draw', 'base', 'n', 'staged', 'stageAt')
publish(cjson.encode({kind = 'drawn'}))
return {'drawn', n - gone}
