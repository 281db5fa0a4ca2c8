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
local ttl, batch, interval, max_active, abandon_after =
  tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
-- KEYS[9] the queue's settings HASH (put_settings.lua): when it exists its
-- values replace ARGV[3..7], so a change made on any instance applies from
-- the very next pass of every instance, whatever policy they still cache.
local stored = redis.call('HMGET', KEYS[9], 'tokenTtlMs', 'batch', 'intervalMs', 'maxActive', 'abandonAfterMs')
if stored[2] then
  ttl, batch, interval, max_active, abandon_after =
    tonumber(stored[1]), tonumber(stored[2]), tonumber(stored[3]), tonumber(stored[4]), tonumber(stored[5])
end
local now = now_ms()
expire_active(now)
local busy = redis.call('ZCARD', K.waiting) > 0

-- Buyers not seen since they entered have no presence entry (a new place
-- writes none, join.lua): their entry time is their presence. The line is
-- in entry order, so they are found by walking it from where the last walk
-- stopped ('~seen' in the entered hash, the last entry id passed) up to the
-- first one who entered at or after `cutoff` and was not seen since. An
-- entry walked past was either seen (presence then covers it until it
-- leaves the line: nothing removes a waiting user from presence) or is
-- dropped here, so each entry is walked once. At most `visits` entries a
-- pass, and drops while `out` holds fewer than `room`, so a pass stays short. Appends {user, seq} to `out`.
local function absent_since_entry(now, cutoff, visits, room, out, marks)
  local last = redis.call('HGET', K.entered, '~seen')
  local walked, done = 0, false
  -- Pages of 16, then 64, then 250 entries (at most `visits` in all): a
  -- walk usually stops at its first entry, a buyer who entered recently.
  local page = 16
  while not done and walked < visits do
    local size = math.min(page, visits - walked)
    local rows = redis.call('ZRANGE', K.waiting, last and '(' .. last or '-inf', '+inf',
      'BYSCORE', 'LIMIT', 0, size, 'WITHSCORES')
    if #rows == 0 then
      break
    end
    local users = {}
    for i = 1, #rows, 2 do
      users[#users + 1] = rows[i]
    end
    local seen = redis.call('ZMSCORE', K.seen, unpack(users))
    done = #rows < 2 * size
    page = math.min(page * 4, 250)
    for i, user in ipairs(users) do
      if not seen[i] then
        local entered = entered_at(user, tonumber(rows[2 * i]), marks)
        if not entered then
          -- No entry time on record: counted as seen now rather than
          -- dropped on a guess.
          seen_now(user, now)
        elseif entered >= cutoff or #out >= room then
          done = true
          break
        else
          local seq = unline(user)
          out[#out + 1] = {user = user, seq = seq}
        end
      end
      last = rows[2 * i]
      walked = walked + 1
    end
  end
  if walked > 0 then
    redis.call('HSET', K.entered, '~seen', last)
  end
end

-- Absent users don't hold the line: drop those not seen for abandon_after
-- (bounded per pass so a pass stays short): the seen ones by their last
-- presence, then those not seen since they entered.
local abandoned = {}
-- The span of marks read last (entered_at's cache): the line's head is
-- a few spans at most.
local marks = {}
if abandon_after > 0 and stock_sweeps(KEYS[10], now, abandon_after) then
  local cutoff = now - abandon_after
  local stale = redis.call('ZRANGEBYSCORE', K.seen, '-inf', '(' .. cutoff, 'LIMIT', 0, 500)
  for _, user in ipairs(stale) do
    local seq = unline(user)
    if seq then
      abandoned[#abandoned + 1] = {user = user, seq = seq}
    end
  end
  absent_since_entry(now, cutoff, 2000, 500, abandoned, marks)
end

local admitted = {}
-- The admitted buyers as the audit log records them: "<entry id> <user>"
-- (audit_each); `admitted` holds their JSON objects.
local audited = {}
local level, at = refill(batch, interval, now)
local stock_left, sold = stock_room(KEYS[10])
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
if n > 0 then
  -- The head with its entry ids in one read; the tokens, the line, its
  -- indexes and the active set gain or lose the whole head in one
  -- command each (500 users a command).
  local head = redis.call('ZRANGE', K.waiting, 0, n - 1, 'WITHSCORES')
  -- Every token of the pass expires at once: formatted once (a number
  -- passed to redis.call is printed as a float, %.17g, each time).
  local exp_s = string.format('%d', now + ttl)
  local users, records, indexes = {}, {}, {}
  local now_s, ttl_s = string.format('%d', now), string.format('%d', ttl)
  for i = 1, #head, 2 do
    -- The entry id as the line printed it: the token's, unprinted again.
    local user, seq_s = head[i], head[i + 1]
    local entered = entered_at(user, tonumber(seq_s), marks)
    local token = ARGV[7 + #users + 1]
    users[#users + 1] = user
    -- token_value's text, all parts strings already.
    records[#records + 1] = token .. ' ' .. exp_s .. ' '
      .. (entered and string.format('%d', entered) or now_s) .. ' ' .. seq_s
    indexes[#indexes + 1] = index_field(token)
    -- The pass's JSON (below) by hand: user ids and tokens are plain
    -- ASCII with nothing to escape (crate::queue::UserId, EntryToken),
    -- and cjson printed each number with a printf of its own.
    admitted[#admitted + 1] = '{"user":"' .. user .. '","seq":' .. seq_s .. ',"token":"'
      .. token .. '","ttlMs":' .. ttl_s .. '}'
    audited[#audited + 1] = seq_s .. ' ' .. user
  end
  if #users > 0 then
    redis.call('ZREMRANGEBYRANK', K.waiting, 0, #users - 1)
  end
  -- The pass's tokens, its line and active set: one command each per 500
  -- buyers.
  for from = 1, #users, 500 do
    local to = math.min(from + 499, #users)
    local chunk, pairs_, tokens = {}, {}, {}
    for i = from, to do
      local user = users[i]
      chunk[#chunk + 1] = user
      pairs_[#pairs_ + 1], pairs_[#pairs_ + 2] = exp_s, user
      local t = #tokens
      tokens[t + 1], tokens[t + 2], tokens[t + 3], tokens[t + 4] = user, records[i], indexes[i], user
    end
    redis.call('HSET', tokens_key(), unpack(tokens))
    redis.call('HDEL', K.entered, unpack(chunk))
    redis.call('ZREM', K.seen, unpack(chunk))
    redis.call('ZADD', K.active, unpack(pairs_))
  end
end
save_bucket(level - #admitted, at)
trim_marks()

local pass = redis.call('INCR', K.pass)
local dropped, dropped_json = {}, {}
for i, a in ipairs(abandoned) do
  local seq_s = string.format('%d', a.seq)
  dropped[i] = seq_s .. ' ' .. a.user
  dropped_json[i] = '{"user":"' .. a.user .. '","seq":' .. seq_s .. '}'
end
audit_each(KEYS[11], 'abandoned', now, dropped, pass)
audit_each(KEYS[11], 'admitted', now, audited, pass)
local msg = string.format(
  '{"kind":"pass","pass":%d,"at":%d,"admitted":[%s],"abandoned":[%s],"waiting":%d,"busy":%s,"held":%s}',
  pass, now, table.concat(admitted, ','), table.concat(dropped_json, ','),
  redis.call('ZCARD', K.waiting), tostring(busy), tostring(held))
if PUBLISH_PASS and (busy or #abandoned > 0) then
  publish(msg)
end
return msg
