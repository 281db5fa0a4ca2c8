-- enter_many.lua: a group of joins in one call (group commit), each with
-- its own outcome, in the order given: the order the instance received
-- them, so the line keeps strict FIFO within the group and across groups
-- (an instance's groups of one queue reach Redis in the order it made
-- them, several may be in flight; the fence below refuses a group that a
-- later one overtook, so none is ever run out of order; a group of one
-- goes as enter.lua with the same fence).
-- KEYS[1..8], ARGV[1..2]: see common.lua. All in the queue's hash tag.
-- ARGV[3]       what every join of the group shares (the queue's policy
--               and the limits' numbers), packed as join.lua's
--               join_config reads it: sent and parsed once per call
-- ARGV[4]       the group's number in its sending task's order (1, 2, ...)
-- ARGV[5..]     two per join, join i at ARGV[5+2(i-1)], ARGV[6+2(i-1)]:
--               the user, the fast-track token
-- KEYS[9..]     m per join, join i at KEYS[9+m(i-1) ..]: the user's token
--               key and request budget, then, only when the address has
--               limits (address join period or places per address above
--               zero: m = 4, else m = 2), the client address's join rate
--               and places (as enter.lua's KEYS[9..12])
-- KEYS[#KEYS-4] the sending task's fence STRING (overtaken, join.lua):
--               the number of the last group of that task run
-- KEYS[#KEYS-3] the queue's stock HASH (see common.lua)
-- KEYS[#KEYS-2] the queue's audit STREAM (common.lua): fast-track admissions
-- KEYS[#KEYS-1] the lottery HASH, KEYS[#KEYS] the pre-queue HASH (see
--               lottery_schedule.lua): a join answers 'prequeue' before a
--               draw; the lottery's state is read once per call
-- Returns 'overtaken', changing nothing, when the task's fence holds a
-- later group (this one was delayed behind it: a retry after a lost
-- connection or a reloaded script cache); the instance fails its joins
-- (503) rather than place them behind later arrivals. Else
-- {now, pass, soldout, ...} and then, per join in order, either the join's
-- row as a table: describe(), or limited(...) for a join refused by a
-- limit (that join changed nothing; the others still count); or, for a run
-- of consecutive joins that each took a new place in line entered at `now`,
-- three numbers: the first one's rank and entry id, and the run's length
-- (each next one is one further back with the next entry id; a new place's
-- describe() row is {'waiting', 1, rank, entry, '', -1, now, rank + 1, pass,
-- soldout}). Most joins of a burst are these: a run costs the reply three
-- numbers however long it is.
-- The same user twice in a group takes one place: the second join sees
-- the first and gets the repeat answer; two joins from one address count
-- twice against its limits, as two calls would.
-- Atomic for the reasons join.lua gives, and so one group is one step: no
-- other call runs between its joins, so they keep the order they were sent.
-- Cost: a lean head (up to --@helpers, see scripts.rs) answers a group of
-- new buyers behind a line with 9 commands (the fence's SET, TIME,
-- EXISTS, the token HASH's HMGET, ZMSCORE, MGET, ZCARD, the counter's SET
-- or MSET, one ZADD; a
-- mark's HGET and HSET when the span or millisecond is new), without
-- making the join helpers' closures; any other group goes on below.
-- The queue's keys by name (K, common.lua, is made after the head).
local waiting_key, seq_key, pass_key, paused_key = KEYS[1], KEYS[2], KEYS[7], KEYS[8]
if overtaken(KEYS[#KEYS - 4], ARGV[4]) then
  return 'overtaken'
end

local n = (#ARGV - 4) / 2
-- Keys per join: 4 when the address has limits (its keys are sent), else
-- 2; the queue's 8, the fence and the 4 queue-wide keys besides.
local m = (#KEYS - 13) / n
local now = now_ms()

-- The repeat check for the whole group in two reads (join.lua's probed):
-- in a burst of new buyers none holds a token, and one ZMSCORE answers
-- who is in line, instead of an EXISTS and a ZSCORE per join.
local users, tokkeys = {}, {}
for i = 1, n do
  users[i] = ARGV[3 + 2 * i]
  tokkeys[i] = KEYS[9 + m * (i - 1)]
end
-- The lottery and the stock go in the same EXISTS: when neither exists
-- (the common case) the call reads neither (group_neither); else the
-- token keys are asked again alone.
tokkeys[n + 1], tokkeys[n + 2] = KEYS[#KEYS - 1], KEYS[#KEYS - 3]
local found = redis.call('EXISTS', unpack(tokkeys))
local neither = found == 0
if not neither then
  tokkeys[n + 1], tokkeys[n + 2] = nil, nil
  found = redis.call('EXISTS', unpack(tokkeys))
end
if found == 0 then
  -- And the queue's token HASH (common.lua), the whole group in one read.
  for _, held in ipairs(redis.call('HMGET', tokens_key(), unpack(users))) do
    if held then
      found = found + 1
    end
  end
end
local scores
if found == 0 then
  scores = redis.call('ZMSCORE', waiting_key, unpack(users))
end

-- The common case, answered here before the helpers below are made (a
-- closure each, per call): no lottery, no stock, no token held (scores
-- read), no address limits, a line that is not empty (no fast track),
-- and every join a new buyer's, each user once. Each then takes a new place (new_place, join.lua):
-- the same reads (one MGET of the queue's STRINGs, one ZCARD), marks,
-- writes (the counter, with the last mark when it moved, then one ZADD)
-- and reply as the loop below. The MGET and ZCARD are what the loop's
-- group_totals would read first, so a call that goes on below keeps them
-- (v, total) and reads neither again.
local v, total
if neither and m == 2 and scores then
  v = redis.call('MGET', pass_key, seq_key, paused_key, last_mark_key())
  total = redis.call('ZCARD', waiting_key)
  local fresh, once = total > 0, {}
  for i = 1, n do
    if not fresh then
      break
    end
    fresh = not scores[i] and not once[users[i]]
    once[users[i]] = true
  end
  if fresh then
    local pass, flags = v[1] and v[1] + 0 or 0, v[3] and 2 or 0
    local seq, mark, mark_moved = (v[2] or select(4, join_head(ARGV[3]))) + 0, v[4], false
    local line, marked, entered = {}, nil, nil
    local out, o, run = {now, pass, flags}, 3, nil
    for i = 1, n do
      seq = seq + 1
      -- As new_place: once a span is marked, the call's later entries in
      -- it share that mark (all have the call's time).
      local span = math.floor(seq / MARK_SPAN)
      if span ~= marked then
        local moved
        entered, moved = mark_entry(seq, now, mark)
        if moved then
          mark, mark_moved = moved, true
        end
        marked = span
      end
      line[2 * i - 1], line[2 * i] = string.format('%d', seq), users[i]
      local rank = total + i - 1
      if entered ~= now then
        run = nil
        o = o + 1
        out[o] = {'waiting', 1, rank, seq, '', -1, entered, rank + 1, pass, flags}
      elseif run then
        out[run + 2] = out[run + 2] + 1
      else
        run = o + 1
        out[o + 1], out[o + 2], out[o + 3] = rank, seq, 1
        o = o + 3
      end
    end
    if mark_moved then
      redis.call('MSET', seq_key, string.format('%d', seq), last_mark_key(), mark)
    else
      redis.call('SET', seq_key, string.format('%d', seq))
    end
    redis.call('ZADD', waiting_key, unpack(line))
    return out
  end
end
--@helpers
local c = join_config(ARGV[3])
local g = group(now, KEYS[#KEYS - 3], KEYS[#KEYS - 2], KEYS[#KEYS - 1], KEYS[#KEYS])
if neither then
  group_neither(g)
end
if v then
  group_known(g, v)
  g.total = total
end

-- A join the repeat check found to be a new buyer's, and the first of
-- that user in the call, goes straight to its new place (new_place,
-- join.lua) when nothing else in join() applies: no address limits (m =
-- 2), no pre-queue, and a line that is not empty (no fast track). Most
-- joins of a burst are these; the others take join() as enter.lua does.
-- (A line that is not empty stays so for the call: no join shortens it.)
local fast = scores ~= nil and m == 2 and not group_pre_queue(g) and group_totals(g) > 0
local out, o, run = {now, 0, 0}, 3, nil
for i = 1, n do
  local k = 9 + m * (i - 1)
  local user = users[i]
  local row, rank, seq, entered
  if fast and not scores[i] and not g.users[user] then
    rank, seq, entered = new_place(g, c, user, nil, g.total)
  else
    local joins_key, places_key
    if m == 4 then
      joins_key, places_key = KEYS[k + 2], KEYS[k + 3]
    end
    row, rank, seq, entered = join(g, KEYS[k], KEYS[k + 1], joins_key, places_key,
      user, ARGV[4 + 2 * i], c, scores ~= nil, scores and scores[i])
  end
  if row then
    o = o + 1
    out[o] = row
    run = nil
  elseif entered == now then
    if run and rank == out[run] + out[run + 2] and seq == out[run + 1] + out[run + 2] then
      out[run + 2] = out[run + 2] + 1
    else
      run = o + 1
      out[o + 1], out[o + 2], out[o + 3] = rank, seq, 1
      o = o + 3
    end
  else
    run = nil
    o = o + 1
    out[o] = waiting_row(g, rank, seq, entered)
  end
end
flush(g)
out[2], out[3] = g.pass or 0, group_sold(g)
return out
