-- admit.lua: one admission pass.
-- KEYS[1..8], ARGV[1..2]: see common.lua; KEYS[9]: below.
-- KEYS[10] the queue's stock HASH (common.lua)
-- KEYS[11] the queue's audit STREAM (common.lua): the buyers dropped,
-- then those admitted, with this pass's number (audit_each: one stream
-- entry for each group of two or more, an entry id for each buyer)
-- ARGV[3] token TTL ms  ARGV[4] batch  ARGV[5] interval ms
-- ARGV[6] max active (-1 = unlimited)  ARGV[7] abandon after ms (0 = never)
-- ARGV[8..] fresh entry tokens, one per user that may be admitted
-- Returns the pass as JSON: {kind="pass", pass, at, admitted=[{user, seq,
-- token, ttlMs}], abandoned=[{user, seq}], waiting, busy} (an admitted user's
-- token keeps their seq as its entry id), and publishes the
-- same JSON on the queue's channel when anyone waited or was dropped
-- (unless PUBLISH_PASS is false: the caller publishes it after WAIT).
-- The pass's tokens go in the queue's token HASH (common.lua,
-- tokens_key: named from ARGV[1], in the queue's hash tag), one HSET for
-- the whole pass.
-- Atomic because popping the head and storing its tokens must be one step
-- (a crash in between would lose users), the budget shared by every
-- instance must be read and spent in the same step (N instances admit no
-- more than one would), and the published pass must match what happened.
-- Also KEYS[1]..':walk', a scratch ZSET in the line's slot (the absence
-- walk's page, absent_since_entry): written and deleted within the pass.
-- KEYS[9] the queue's settings HASH (put_settings.lua): when it exists its
-- values replace ARGV[3..7], so a change made on any instance applies from
-- the very next pass of every instance, whatever policy they still cache.
local policy = redis.call('HMGET', KEYS[9], 'tokenTtlMs', 'batch', 'intervalMs', 'maxActive',
  'abandonAfterMs')
if not policy[2] then
  policy = {ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7]}
end
local ttl, batch, interval, max_active, abandon_after =
  policy[1] + 0, policy[2] + 0, policy[3] + 0, policy[4] + 0, policy[5] + 0
local now = now_ms()
expire_active(now)
local waiting = redis.call('ZCARD', K.waiting)
local busy = waiting > 0
local stock = stock_read(KEYS[10])

-- Span offsets as the marks print them (0..15), to numbers by a look-up.
local OFFSET = {['0'] = 0, ['1'] = 1, ['2'] = 2, ['3'] = 3, ['4'] = 4, ['5'] = 5, ['6'] = 6,
  ['7'] = 7, ['8'] = 8, ['9'] = 9, ['10'] = 10, ['11'] = 11, ['12'] = 12, ['13'] = 13,
  ['14'] = 14, ['15'] = 15}

-- entered_at (common.lua) for the entries a pass reads in line order (the
-- absence walk's absent buyers): each span's marks are read and parsed once
-- into offset -> time, in `cache` (a table kept for the pass, in which the
-- marks do not change), where a search of the text per entry cost more
-- than the rest of an admission. `seq_s`: the entry id as the line
-- printed it. Returns the time, or nil.
local function pass_entered(user, seq_s, cache)
  local seq = seq_s + 0
  local b = math.floor(seq / MARK_SPAN)
  if cache.span ~= b then
    local marks = redis.call('HGET', K.entered, '^' .. string.format('%d', b))
    local times = false
    if marks then
      times = {}
      local t0
      for o, d in marks:gmatch('(%d+),(%d+)') do
        local at = t0 and t0 + d or d + 0
        t0 = t0 or at
        times[OFFSET[o] or o + 0] = at
      end
    end
    cache.span, cache.times = b, times
  end
  local times = cache.times
  if times then
    for o = seq - b * MARK_SPAN, 0, -1 do
      local at = times[o]
      if at then
        return at
      end
    end
  end
  return (entered_at(user, seq))
end

-- Buyers not seen since they entered have no presence entry (a new place
-- writes none, join.lua): their entry time is their presence. The line is
-- in entry order, so they are found by walking it from where the last walk
-- stopped ('~seen' in the entered hash: the walk goes on after that entry
-- id) up to the first one who entered at or after `cutoff` and was not
-- seen since. An entry walked past was either seen (presence then covers
-- it until it leaves the line: nothing removes a waiting user from
-- presence) or is dropped here, so each entry is walked once. At most
-- `visits` entries a pass, and drops while `out` holds fewer than `room`,
-- so a pass stays short. `length`: the line's length as the walk starts.
-- Appends {user, seq} to `out`.
local function absent_since_entry(now, cutoff, visits, room, out, marks, length)
  local stored = redis.call('HGET', K.entered, '~seen')
  local last = stored
  -- A page of the line is copied into a scratch ZSET (the line's key with
  -- ':walk', in its slot; deleted before the pass ends) and only its
  -- members absent from presence come back (ZDIFF): a present buyer, the
  -- most walked row in a sale where everyone's page is open, is copied and
  -- looked up inside Redis and never printed (the presence score ZMSCORE
  -- printed cost about 3,800 instructions in Redis 7.0's %.17g, more than
  -- the copy and the look-up together). Pages of 4 and 16 (a walk usually
  -- stops at its first entry, a buyer who entered recently), then wide
  -- ones: a page is copied by rank, so one longer than the server keeps
  -- as a listpack (zset-max-listpack-entries, 128 by default) is made a
  -- skiplist at once, where a copy into a listpack searches it from the
  -- start for each row (quadratic: about 24,000 instructions a row at
  -- 128). So no page is copied of 17 to 128 rows (what is left of the
  -- line or of `visits` is walked in pages of 16), and the first wide
  -- page, 129, tells which the server does: where it keeps that many as
  -- a listpack the walk goes on in pages of 16 (as dear a row as the
  -- printed presence was), else in pages of 250.
  local scratch = K.waiting .. ':walk'
  -- The rank the walk goes on from: the entries at or before `last`.
  local from = last and redis.call('ZCOUNT', K.waiting, '-inf', last) or 0
  local walked, done = 0, false
  -- `wide`: the page after the probe (nil until then).
  local page, wide = 4, nil
  while not done and walked < visits do
    local size = math.min(page, visits - walked, length - from)
    if size > 16 and size < 129 then
      size = 16
    end
    if size <= 0 then
      break
    end
    local n = redis.call('ZRANGESTORE', scratch, K.waiting, from, from + size - 1)
    if n == 0 then
      break
    end
    done = n < size
    if not wide and n == 129 then
      wide = redis.call('OBJECT', 'ENCODING', scratch) == 'listpack' and 16 or 250
      page = wide
    elseif not wide then
      page = page < 16 and page * 4 or 129
    end
    -- The absent ones' entry ids are read one at a time, as each is
    -- reached: a walk stops at the first who entered recently.
    local absent = redis.call('ZDIFF', 2, scratch, K.seen)
    local stopped, dropped = false, 0
    for _, user in ipairs(absent) do
      local seq_s = redis.call('ZSCORE', K.waiting, user)
      local entered = pass_entered(user, seq_s, marks)
      if not entered then
        -- No entry time on record: counted as seen now rather than
        -- dropped on a guess.
        seen_now(user, now)
      elseif entered >= cutoff or #out >= room then
        -- Not passed: the next walk starts at this entry (ids are whole
        -- numbers: none lies between it and the one before).
        last, stopped = string.format('%d', seq_s - 1), true
        break
      else
        drop_from_line(user)
        dropped = dropped + 1
        out[#out + 1] = {user = user, seq = seq_s + 0}
      end
    end
    walked = walked + n
    if stopped then
      done = true
    else
      last = redis.call('ZRANGE', scratch, -1, -1, 'WITHSCORES')[2]
      -- The next page starts after this one, less the entries dropped
      -- from it (the line moved up by as many).
      from = from + n - dropped
      length = length - dropped
    end
  end
  if walked > 0 then
    redis.call('DEL', scratch)
    -- A walk that stops where the last one did (at a buyer who entered
    -- recently, the most common walk) leaves it as it was.
    if last ~= stored then
      redis.call('HSET', K.entered, '~seen', last)
    end
  end
end

-- Absent users don't hold the line: drop those not seen for abandon_after
-- (bounded per pass so a pass stays short): the seen ones by their last
-- presence, then those not seen since they entered.
local abandoned = {}
-- The span of marks read last (pass_entered's cache).
local marks = {}
if abandon_after > 0 and stock_sweeps(stock, now, abandon_after) then
  local cutoff = now - abandon_after
  local stale = redis.call('ZRANGEBYSCORE', K.seen, '-inf', '(' .. cutoff, 'LIMIT', 0, 500)
  for _, user in ipairs(stale) do
    local seq = unline(user)
    if seq then
      abandoned[#abandoned + 1] = {user = user, seq = seq}
    end
  end
  absent_since_entry(now, cutoff, 2000, 500, abandoned, marks, waiting - #abandoned)
end
waiting = waiting - #abandoned

-- The pass's JSON in pieces, joined once at the end (each big string a
-- pass makes is paid again in Lua's garbage collection, by its bytes):
-- [1] its head (made last: the pass number is taken at the end), then
-- each admitted buyer's object, then its tail. And the audit log's
-- "entry user" pairs (audit_each, flat: entry, user, entry, user, ...).
local out, audited = {false}, {}
local count = 0
local level, at = refill(batch, interval, now)
local stock_left, sold = stock_room(KEYS[10], stock)
local n = math.min(math.floor(level), room(max_active), #ARGV - 7, batch, stock_left)
-- The hold and the sold-out flag's copy (sold_out_key, common.lua) in
-- one read; the copy set right when it differs from the stock's flag.
local flags = redis.call('MGET', K.paused, sold_out_key(KEYS[10]))
local held = flags[1] ~= false
if sold ~= (flags[2] ~= false) then
  copy_sold_out(KEYS[10], sold)
end
if held then
  n = 0 -- held by an operator: the line waits, presence still counts
end
-- The line's head after the pass, as trim_marks takes it (nil: not read).
local next_head
if n > 0 then
  -- The head with its entry ids in one read, and the entry after it (the
  -- head the pass leaves, for trim_marks); the tokens, the line, its
  -- presence and the active set gain or lose the whole head in one
  -- command each (500 users a command), their arguments gathered as the
  -- head is walked.
  local head = redis.call('ZRANGE', K.waiting, 0, n, 'WITHSCORES')
  next_head = head[2 * n + 2] or false
  -- Every token of the pass expires at once: formatted once (a number
  -- passed to redis.call is printed as a float, %.17g, each time).
  local exp_s = string.format('%d', now + ttl)
  local ttl_s = string.format('%d', ttl)
  local fields, members, users = {}, {}, {}
  for i = 1, math.min(#head, 2 * n), 2 do
    -- The entry id as the line printed it: the token's, unprinted again.
    local user, seq_s = head[i], head[i + 1]
    count = count + 1
    local token = ARGV[7 + count]
    -- The user's field (token_value's text, from strings already made)
    -- and the token's index field, common.lua. No entry time (-1): the
    -- entry's marks stay while the token may live (trim_marks) and it is
    -- read from them when asked (token_entered), where finding and
    -- printing it here cost a fifth of a pass.
    local f = 4 * count
    fields[f - 3], fields[f - 2], fields[f - 1], fields[f] =
      user, token .. ' ' .. exp_s .. ' -1 ' .. seq_s, index_field(token), user
    members[2 * count - 1], members[2 * count] = exp_s, user
    users[count] = user
    -- The pass's JSON (below) by hand: user ids and tokens are plain
    -- ASCII with nothing to escape (crate::queue::UserId, EntryToken),
    -- and cjson printed each number with a printf of its own.
    out[count + 1] = (count > 1 and ',{"user":"' or '{"user":"') .. user .. '","seq":' .. seq_s
      .. ',"token":"' .. token .. '","ttlMs":' .. ttl_s .. '}'
    audited[2 * count - 1], audited[2 * count] = seq_s, user
  end
  if count > 0 then
    redis.call('ZREMRANGEBYRANK', K.waiting, 0, count - 1)
  end
  -- Entry times of the oldest layout, a field per user, which no mark
  -- holds: into their tokens, and the fields go with their users
  -- (drop_from_line). Its entries are the line's oldest, so a pass whose
  -- first buyer has no such field looks no further (one that an instance
  -- of that version added behind a later layout's, in a rolling upgrade,
  -- is read by token_entered all the same, its field kept until nobody
  -- waits or holds a place: trim_marks).
  local oldest = count > 0 and redis.call('HGET', K.entered, users[1])
  for from = 1, count, 500 do
    local to = math.min(from + 499, count)
    if oldest then
      local own = redis.call('HMGET', K.entered, unpack(users, from, to))
      local gone = {}
      for j, at in ipairs(own) do
        if at then
          local i = from + j - 1
          fields[4 * i - 2] = string.format('%s %s %d %s', ARGV[7 + i], exp_s, at + 0, head[2 * i])
          gone[#gone + 1] = users[i]
        end
      end
      if #gone > 0 then
        redis.call('HDEL', K.entered, unpack(gone))
      end
    end
    redis.call('HSET', tokens_key(), unpack(fields, 4 * from - 3, 4 * to))
    redis.call('ZREM', K.seen, unpack(users, from, to))
    redis.call('ZADD', K.active, unpack(members, 2 * from - 1, 2 * to))
  end
  waiting = waiting - count
end
save_bucket(level - count, at)
trim_marks(next_head, now, ttl)

local pass = redis.call('INCR', K.pass)
local dropped, dropped_json = {}, {}
for i, a in ipairs(abandoned) do
  local seq_s = string.format('%d', a.seq)
  dropped[2 * i - 1], dropped[2 * i] = seq_s, a.user
  dropped_json[i] = '{"user":"' .. a.user .. '","seq":' .. seq_s .. '}'
end
audit_each(KEYS[11], 'abandoned', now, dropped, pass)
audit_each(KEYS[11], 'admitted', now, audited, pass)
out[1] = string.format('{"kind":"pass","pass":%d,"at":%d,"admitted":[', pass, now)
out[#out + 1] = string.format('],"abandoned":[%s],"waiting":%d,"busy":%s,"held":%s}',
  table.concat(dropped_json, ','), waiting, tostring(busy), tostring(held))
local msg = table.concat(out)
if PUBLISH_PASS and (busy or #abandoned > 0) then
  publish(msg)
end
return msg
