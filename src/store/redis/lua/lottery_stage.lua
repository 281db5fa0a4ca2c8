-- lottery_stage.lua: stages the next chunk of a lottery draw's order
-- (see lottery_begin.lua): each user gets their drawn entry id in the
-- stage's line, presence and records; nothing a buyer can see changes.
-- KEYS[1..16], ARGV[1..2]: as lottery_begin.lua.
-- ARGV[3] the draw's id
-- ARGV[4] order positions staged before this chunk (0 for the first)
-- ARGV[5..] the chunk's users, in drawn order
-- Returns {'staged', k} (k positions staged now; a chunk already staged,
-- as on a retry, changes nothing); {'already'} when the draw has run;
-- {'lost'} when this draw no longer holds the stage (it was abandoned and
-- replaced, or the chunk is not the next); {'stale'} when the order is
-- not the frozen pre-queue's (a user not in it, or twice): the stage is
-- dropped and the lottery is scheduled again.
-- A user of the order who left since the freeze is skipped: their id
-- stays unused (the line is ordered by id, so a gap changes no rank).
-- Atomic so a chunk is staged whole or not at all, against the stage this
-- draw holds; it is bounded by its size (the caller's chunk, 1,000 by default).
local lot, pre = KEYS[9], KEYS[10]
local stage, stage_seen, stage_pre, left = KEYS[12], KEYS[13], KEYS[14], KEYS[15]
local f = redis.call('HMGET', lot, 'state', 'draw', 'base', 'n', 'staged')
if f[1] == 'drawn' then
  return {'already'}
end
if f[1] ~= 'drawing' or f[2] ~= ARGV[3] then
  return {'lost'}
end
local base, n, staged = tonumber(f[3]), tonumber(f[4]), tonumber(f[5])
local from, k = tonumber(ARGV[4]), #ARGV - 4
if from < staged and from + k <= staged then
  return {'staged', staged}
end
if from ~= staged then
  return {'lost'}
end
local function drop()
  redis.call('UNLINK', stage, stage_seen, stage_pre, left, KEYS[16])
  redis.call('HSET', lot, 'state', 'scheduled')
  redis.call('HDEL', lot, 'draw', 'base', 'n', 'staged', 'stageAt')
  return {'stale'}
end
if staged + k > n then
  return drop()
end
local now = now_ms()
-- Commands take their arguments on Lua's stack: read and write in parts.
local PART = 1000
for lo = 1, k, PART do
  local hi = math.min(k, lo + PART - 1)
  local got = redis.call('HMGET', pre, unpack(ARGV, 4 + lo, 4 + hi))
  local line, seen, recs = {}, {}, {}
  for i = lo, hi do
    local user, rec = ARGV[4 + i], got[i - lo + 1]
    local p = rec and tonumber(rec:match('^(%d+):'))
    if p and p <= base then
      local id = base + staged + i
      line[#line + 1], line[#line + 2] = id, user
      seen[#seen + 1], seen[#seen + 2] = now, user
      recs[#recs + 1], recs[#recs + 2] = user, rec .. string.format(':%d', id)
    elseif redis.call('SISMEMBER', left, user) == 0 then
      return drop()
    end
  end
  if #line > 0 then
    -- NX: a user named twice adds once, and the count shows it.
    if redis.call('ZADD', stage, 'NX', unpack(line)) ~= #line / 2 then
      return drop()
    end
    redis.call('ZADD', stage_seen, unpack(seen))
    redis.call('HSET', stage_pre, unpack(recs))
  end
end
redis.call('HSET', lot, 'staged', staged + k, 'stageAt', now)
return {'staged', staged + k}
