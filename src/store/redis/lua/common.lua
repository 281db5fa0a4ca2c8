-- common.lua: helpers prepended to every other script at load time (Redis
-- scripts cannot include one another). Not a script on its own. A prelude
-- from scripts.rs comes first and sets PUBLISH ('PUBLISH' on one Redis,
-- 'SPUBLISH' in a cluster, where a plain PUBLISH is copied to every node)
-- and PUBLISH_PASS (false when the caller publishes an admission pass
-- itself, after replicas acknowledged it: --redis-wait-replicas).
--
-- Every script receives the queue's keys in this order, all sharing the
-- queue's {hash tag} so a script touches one cluster slot:
--   KEYS[1] waiting  ZSET user -> arrival sequence (the line, strict FIFO)
--   KEYS[2] seq      STRING entry counter (INCR): every entry's id, the
--                    arrival sequence, fast track included
--   KEYS[3] entered  HASH of entry times of waiting entries, by entry id:
--                    field '^'..floor(id / 16) holds that span's marks,
--                    "o,T o,d o,d ..." (offset in the span, then the first
--                    mark's time ms, then each later one's ms after it):
--                    an entry's time is the last mark at or before it, so
--                    a burst costs one mark per span and millisecond, not
--                    one field per user (mark_entry, entered_at, trim_marks);
--                    '^lo' the lowest span that may hold marks; '~seen'
--                    the last entry id admit.lua's absence walk passed
--                    (absent_since_entry, admit.lua). The marks of
--                    admitted entries stay while their tokens may live
--                    (an admitted buyer's time is read from them when
--                    asked: token_entered; '^keep' says until when,
--                    trim_marks). Written by earlier
--                    versions, still read and dropped: the same marks in
--                    spans of 128, '~'..floor(id / 128) ('~lo' the
--                    lowest), and fields named by a user id (which cannot
--                    contain '~' or '^'), entry times written per user,
--                    deleted as their users leave the line.
--                    The last mark's span and time are kept beside the
--                    counter too (last_mark_key), so a join need not
--                    read the marks.
--   KEYS[4] seen     ZSET user -> last seen ms (presence): waiting users
--                    seen since they entered. A new place writes none
--                    (the dearest write of a join otherwise): a buyer not
--                    in it counts as seen at their entry time, and
--                    touch.lua, status.lua and a repeat join add them
--   KEYS[5] active   ZSET user -> token expiry ms (holders; maxActive)
--   KEYS[6] bucket   HASH level, at (the shared admission budget)
--   KEYS[7] pass     STRING admission pass counter
--   KEYS[8] paused   STRING present while an operator holds admission
--   KEYS[9] token    the one user the script is about (scripts that name
--                    a user; statuses passes one per user, KEYS[9..]):
--                    ARGV[1]..user, their token's key in the earlier
--                    layout (tokens_key, below), read only when the
--                    queue's token HASH has none for them
--   ARGV[1] token key prefix: the queue's tokens live in one HASH,
--           ARGV[1]..'#tokens' (tokens_key, below: a field per holder and
--           one per token naming its holder); the prefix carries the
--           queue's hash tag, so it and the earlier layout's keys are in
--           the script's slot.
--   ARGV[2] pub/sub channel of the queue (same hash tag: in a cluster its
--           sharded channel lives on the queue's master)
-- Script-specific arguments start at ARGV[3].

-- K names them. It is a table made on every call (about a microsecond
-- here), so the helpers a lean head uses (see scripts.rs: last_mark_key,
-- mark_entry, entered_at, seen_now) and the heads themselves name their
-- keys KEYS[n]: a head that names no K answers before K is made.
local K = {
  waiting = KEYS[1], seq = KEYS[2], entered = KEYS[3], seen = KEYS[4],
  active = KEYS[5], bucket = KEYS[6], pass = KEYS[7], paused = KEYS[8],
  token = KEYS[9], tokprefix = ARGV[1], channel = ARGV[2],
}

-- Publishes an event on the queue's channel.
local function publish(msg)
  redis.call(PUBLISH, K.channel, msg)
end

-- Numbers Redis printed (TIME, a score, a counter, a field written as
-- digits) and digits a pattern captured are made numbers by arithmetic,
-- `s + 0`, where no nil can reach it: one strtod, where tonumber makes two
-- (it asks lua_isnumber, then converts again), each about 700 instructions
-- for a 13-digit id. tonumber stays where a value may be absent or not a
-- number.

-- The store clock: Redis TIME, so every instance shares one clock.
local function now_ms()
  local t = redis.call('TIME')
  return t[1] * 1000 + math.floor(t[2] / 1000)
end

-- Token bucket: starts full, refills continuously at batch per interval
-- (fractions carry over), holds at most one interval's worth.
local function refill(batch, interval, now)
  local b = redis.call('HMGET', K.bucket, 'level', 'at')
  if not b[1] then
    return batch, now
  end
  local level, at = b[1] + 0, b[2] + 0
  if now > at then
    level = math.min(batch, level + (now - at) * batch / interval)
    at = now
  end
  return level, at
end

local function save_bucket(level, at)
  redis.call('HSET', K.bucket, 'level', string.format('%.17g', level), 'at', at)
end


local function room(max_active)
  if max_active < 0 then
    return math.huge
  end
  return math.max(0, max_active - redis.call('ZCARD', K.active))
end

-- Takes the next entry id. A new counter starts at `first` (random, from
-- the caller) rather than 1, so ids are not reissued after the data is lost
-- and tickets signed for old entries can never match new ones.
local function next_entry(first)
  redis.call('SET', K.seq, first, 'NX')
  return redis.call('INCR', K.seq)
end

-- Entry tokens: one HASH per queue, tokens_key(), named from the token
-- prefix (so it shares the queue's hash tag), written a whole admission
-- pass at a time (admit.lua: one HSET for all its buyers, where a key per
-- token cost three writes a buyer). Two kinds of fields:
--   user             "token exp enteredAt entry[ claim claimUntil]"
--                    (numbers in ms; claim and claimUntil while an order
--                    holds the token, claim.lua; enteredAt -1 where an
--                    admission pass issued it: the entry's time is read
--                    from the marks kept for holders, token_entered, and
--                    written in by a claim that lengthens the token)
--   '#'..token       the user (index_field: token_holder.lua, for the
--                    token API's claim by the token alone); '#' is in no
--                    user id. The token itself, not a digest (a SHA-1 a
--                    buyer cost an admission pass more than its HSET):
--                    a field names no key (SCAN never shows it), and the
--                    user's own field holds the token anyway.
-- A token and its index go together (one HSET, one HDEL). Neither expires
-- on its own: expire_active drops them once their holder leaves the
-- active set (whose score is never below the token's exp); until then
-- every reader checks exp itself.
-- The earlier layout, written by earlier versions: a HASH per token at
-- ARGV[1]..user (token, enteredAt, exp, entry, claim, claimUntil;
-- PEXPIREAT exp) and a STRING ARGV[1]..'#'..sha1(token) naming its user.
-- Still read (token_get, token_holder.lua) until they expire, and moved
-- into the HASH by the first write to them (token_put).
local function tokens_key()
  return ARGV[1] .. '#tokens'
end

local function index_field(token)
  return '#' .. token
end

-- The earlier layout's index STRING of `token` (see above).
local function old_index(token)
  return ARGV[1] .. '#' .. redis.sha1hex(token)
end

-- A user's field of tokens_key() as a record: {token, exp, entered, entry,
-- entry_s (as written), claim, claim_until} (absent parts nil).
-- One match for the four parts every record has (a gmatch loop cost a
-- C call and a table write a part), one more for a claim's two.
local function token_record(v)
  local token, exp, entered, entry, rest = v:match('^(%S+) (%S+) (%S+) (%S+)(.*)$')
  local claim, claim_until
  if rest ~= '' then
    claim, claim_until = rest:match('^ (%S+) ?(%S*)')
  end
  return {token = token, exp = exp + 0, entered = entered + 0, entry = entry + 0,
          entry_s = entry, claim = claim, claim_until = tonumber(claim_until)}
end

-- A record (its times numbers) as its user's field of tokens_key();
-- admit.lua writes the same text from strings it has printed already.
local function token_value(rec)
  local v = string.format('%s %d %d %s', rec.token, rec.exp, rec.entered or -1,
    rec.entry_s or string.format('%d', rec.entry or -1))
  if rec.claim then
    v = string.format('%s %s %d', v, rec.claim, rec.claim_until or 0)
  end
  return v
end

-- The token record (as token_record's) in `old`, a user's key of the
-- earlier layout, with old = that key; or nil.
local function old_token(old)
  local t = redis.call('HMGET', old, 'token', 'exp', 'enteredAt', 'entry', 'claim', 'claimUntil')
  if not t[1] then
    return nil
  end
  return {token = t[1], exp = tonumber(t[2]) or 0, entered = tonumber(t[3]), entry = tonumber(t[4]),
          entry_s = t[4] or nil, claim = t[5] or nil, claim_until = tonumber(t[6]), old = old}
end

-- `user`'s token record (token_record), or nil. `old` is the user's key of
-- the earlier layout (KEYS[9] where a script names the user; else built
-- from ARGV[1]): read only when the HASH has no token for them.
local function token_get(user, old)
  local v = redis.call('HGET', tokens_key(), user)
  if v then
    return token_record(v)
  end
  return old_token(old or ARGV[1] .. user)
end

-- Writes `user`'s record back (a claim, its renewal or release): into the
-- HASH, so a record of the earlier layout moves there (its key deleted;
-- its index STRING, left to expire, names the same user).
local function token_put(user, rec)
  if rec.old then
    redis.call('HSET', tokens_key(), user, token_value(rec), index_field(rec.token), user)
    redis.call('DEL', rec.old)
    rec.old = nil
  else
    redis.call('HSET', tokens_key(), user, token_value(rec))
  end
end

-- Ends `user`'s token (consumed, given up, turned into a session).
local function token_del(user, rec)
  if rec.old then
    redis.call('DEL', rec.old)
  else
    redis.call('HDEL', tokens_key(), user, index_field(rec.token))
  end
end

-- Issues a token to user (the fast track: admit.lua writes a pass's
-- records itself) and adds them to the active set.
-- Returns the expiry.
local function issue(user, token, entered_at, ttl, now, entry)
  local exp = now + ttl
  redis.call('HSET', tokens_key(), user,
    token_value({token = token, exp = exp, entered = entered_at, entry = entry}),
    index_field(token), user)
  redis.call('ZADD', K.active, exp, user)
  return exp
end

-- Whether `who`'s place, counted against an address at entry id `entry`,
-- still lasts: they wait with that entry or hold a token issued to it, or
-- (with `pre_key`, the lottery's pre-queue HASH) it is their pre-queue
-- entry, not drawn yet or drawn to a place that lasts.
local function place_live(pre_key, who, entry)
  local function holds(id)
    return tonumber(redis.call('ZSCORE', K.waiting, who)) == id
      or (token_get(who) or {}).entry == id
  end
  if holds(entry) then
    return true
  end
  local rec = pre_key and redis.call('HGET', pre_key, who)
  if not rec then
    return false
  end
  local p, e = rec:match('^(%d+):%x+:?(%d*)$')
  if tonumber(p) ~= entry then
    return false
  end
  return e == '' or holds(tonumber(e))
end

-- Drops expired holders from the active set (lazy clean-up), and their
-- tokens (tokens_key()): a holder's score is never below their token's
-- exp, so a token whose holder is dropped has expired (one that has not,
-- should a score ever be lower, keeps its record and its place).
local function expire_active(now)
  local gone = redis.call('ZRANGE', K.active, '-inf', now, 'BYSCORE')
  if #gone == 0 then
    return
  end
  local keep = {}
  for from = 1, #gone, 500 do
    local chunk = {unpack(gone, from, math.min(from + 499, #gone))}
    local recs = redis.call('HMGET', tokens_key(), unpack(chunk))
    local fields = {}
    for i, v in ipairs(recs) do
      if v then
        local rec = token_record(v)
        if rec.exp and rec.exp > now then
          keep[#keep + 1], keep[#keep + 2] = rec.exp, chunk[i]
        else
          fields[#fields + 1], fields[#fields + 2] = chunk[i], index_field(rec.token)
        end
      end
    end
    if #fields > 0 then
      redis.call('HDEL', tokens_key(), unpack(fields))
    end
  end
  redis.call('ZREMRANGEBYRANK', K.active, 0, #gone - 1)
  if #keep > 0 then
    redis.call('ZADD', K.active, unpack(keep))
  end
end

-- Entry times (KEYS[3]): the span of entry ids one field of marks covers,
-- '^'..span. Short, because every look-up reads its span's marks whole
-- and a reply's bytes cost the script about 1.3 ns each: a span of 16
-- marked one entry a millisecond is about 110 bytes, where one of 128
-- was 900 (1.5 us more a look-up; docs/benchmarks). Marks an earlier
-- version wrote, in spans of 128 under '~'..span, are still read
-- (entered_at) and dropped (trim_marks) while their entries wait.
local MARK_SPAN = 16
local OLD_SPAN = 128

local function span_of(seq)
  local b = math.floor(seq / MARK_SPAN)
  return '^' .. string.format('%d', b), seq - b * MARK_SPAN, b
end

-- The last mark: a STRING "^span,ms" beside the entry counter (its key
-- is the counter's with ':mark'), the newest span marked and its last
-- mark's time. Written with the counter by the joins that mark (one
-- MSET; mark_entry says what to write), dropped with the marks
-- (trim_marks) and by a lottery's commit. A join reads it with its
-- STRINGs: while its entry falls in that span and the clock has not
-- passed that time (the joins of one millisecond), its time is that
-- mark's, and the marks are neither read nor written. A later mark it
-- does not know of (written by an earlier version) has a later time on
-- the same clock, so it is never trusted past one; an earlier version's
-- value ("span,ms", a span of 128) is not trusted at all (the '^').
local function last_mark_key()
  return KEYS[2] .. ':mark'
end

-- Records that waiting entry `seq` was made at `now`: a mark, unless the
-- span's last mark already has this time. Entry ids and the store clock
-- both only grow, so the entries after a mark share its time until the
-- next; should the clock step back, the entries of that moment keep the
-- last mark's time (a few ms late) rather than break the marks' order.
-- `known`: the last mark's STRING as the caller read it (nil: not read).
-- Returns the entry's time as entered_at will read it, and the last
-- mark's new value for the caller to write (nil: unchanged).
local function mark_entry(seq, now, known)
  local b = math.floor(seq / MARK_SPAN)
  -- The joins of the last mark's millisecond in its span (the common case
  -- of a burst): one string made and compared, no pattern, no mark read.
  local here = string.format('^%d,%d', b, now)
  if known == here then
    return now, nil
  end
  -- The span's field is `here` before its comma; `known` is this span's
  -- when it starts as `here` does (substrings and a plain find: no
  -- pattern, no number printed again). The span's last mark's time, then.
  local comma = here:find(',', 3, true)
  local last
  if known and known:sub(1, comma) == here:sub(1, comma) then
    local kt = known:sub(comma + 1) + 0
    if now <= kt then
      return kt, nil
    end
    last = kt
  end
  local field, offset = here:sub(1, comma - 1), seq - b * MARK_SPAN
  local marks = redis.call('HGET', KEYS[3], field)
  if not marks then
    redis.call('HSET', KEYS[3], field, string.format('%d,%d', offset, now))
    redis.call('HSETNX', KEYS[3], '^lo', field:sub(2))
    return now, here
  end
  local first = marks:match('^%d+,(%d+)') + 0
  -- Unless `known` named the last mark's time (every writer of the '^'
  -- value keeps it with the marks it adds; a lottery's commit, which adds
  -- marks out of order, drops it), the marks' text says it.
  if not last then
    last = first
    if marks:find(' ', 1, true) then
      -- The string's trailing number, looked for in its last bytes only
      -- (a mark is at most 18 of them; a pattern ending in '$' alone
      -- would be tried from every byte).
      last = first + marks:sub(-24):match('(%d+)$')
    end
  end
  if now > last then
    redis.call('HSET', KEYS[3], field, marks .. string.format(' %d,%d', offset, now - first))
    return now, here
  end
  return last, string.format('^%d,%d', b, last)
end

-- The time of the last mark at or before span offset `offset` in a
-- span's marks (mark_entry), or nil if its first mark is after it. An
-- entry whose joins came a millisecond or more apart has a mark of its
-- own: one plain search (C, no pattern) finds it. Else, marks being in
-- offset order, a binary search over the string's bytes finds the last
-- one before it in a few anchored matches, however many marks the span
-- holds. Each string call costs about as much as a Redis command inside
-- a script, so the fewer the better.
local function mark_time(marks, offset)
  local o, t = marks:match('^(%d+),(%d+)')
  o, t = o + 0, t + 0
  if o >= offset then
    return o == offset and t or nil
  end
  local _, own = marks:find(' ' .. offset .. ',', 1, true)
  if own then
    return t + marks:match('^%d+', own + 1)
  end
  -- lo: the first byte of a mark at or before offset; hi: the first
  -- byte of one after it (or past the end). A mark starts after a space.
  local lo, hi = 1, #marks + 2
  while true do
    local s = marks:find(' ', math.floor((lo + hi) / 2), true)
    if not s or s + 1 >= hi then
      s = marks:find(' ', lo, true)
      if not s or s + 1 >= hi then
        break
      end
    end
    if marks:match('^%d+', s + 1) + 0 <= offset then
      lo = s + 1
    else
      hi = s + 1
    end
  end
  if lo == 1 then
    return t
  end
  return t + marks:match('^%d+,(%d+)', lo)
end

-- The entry time (ms) of waiting `user`, whose entry id is `seq`, or nil
-- if nothing recorded it (admit.lua reads a pass's spans of 16 itself,
-- pass_entered, and asks here for what it does not find there). The
-- second result is true when the time came from the user's own field
-- (the oldest layout: the caller deletes it as the user leaves the line;
-- no later layout writes one).
local function entered_at(user, seq)
  local field, offset = span_of(seq)
  local marks = redis.call('HGET', KEYS[3], field)
  local at = marks and mark_time(marks, offset)
  if not at then
    -- Not marked in its span: an entry an earlier version marked, in
    -- its span of 128, or (older still) by its user.
    local ob = math.floor(seq / OLD_SPAN)
    local old = redis.call('HGET', KEYS[3], '~' .. string.format('%d', ob))
    at = old and mark_time(old, seq - ob * OLD_SPAN)
  end
  if at then
    return at, false
  end
  return tonumber(redis.call('HGET', KEYS[3], user)), true
end

-- Drops the fields of spans `lo`.. before the head's span `hb` (at most
-- 1000), named `prefix`..span, in one HDEL, and moves the lowest span
-- (`lo_field`) past them. Returns how many existed.
local function drop_spans(prefix, lo_field, lo, hb)
  local to = math.min(hb - 1, lo + 999)
  if to < lo then
    return nil
  end
  local fields = {}
  for b = lo, to do
    fields[#fields + 1] = prefix .. string.format('%d', b)
  end
  local dropped = redis.call('HDEL', K.entered, unpack(fields))
  redis.call('HSET', K.entered, lo_field, string.format('%d', to + 1))
  return dropped
end

-- Drops the marks nobody needs (admit.lua, after its pass): those of
-- entries that left the line, once no token issued to them can still be
-- live (an admitted buyer's time is read from the marks when asked,
-- token_entered), at most 1000 spans a call (the rest on later calls);
-- all of them once nobody waits or holds a place. An earlier version's
-- spans of 128 ('~lo' their lowest) go the same way; once a call finds
-- none of them left, '~lo' goes too. `head`: the head's entry id as the
-- line printed it, or false for an empty line, when the caller read it
-- (nil: read here); `ttl`: the token life of the pass's tokens.
-- How long marks stay, '^keep' = "free,past,until,ttl": the marks of
-- entries below `free` may go; those below `past` (the entries that had
-- left the line when it was written) may go once the clock passes
-- `until`, by when every token issued to them has expired (`until` is
-- then plus the longest token life of the passes before; `ttl` the
-- longest since, for the next `until`). A claim, the one thing that
-- lengthens a token, writes its time into the token first (claim.lua).
-- So marks stay one to two token lives after their entries leave, and a
-- pass writes '^keep' about once a token life.
local function trim_marks(head, now, ttl)
  if head == nil then
    head = redis.call('ZRANGE', K.waiting, 0, 0, 'WITHSCORES')[2] or false
  end
  local r = redis.call('HMGET', K.entered, '^lo', '~lo', '^keep')
  local bound
  if redis.call('ZCARD', K.active) == 0 then
    if not head then
      redis.call('DEL', K.entered, last_mark_key())
      return
    end
    bound = head + 0
    if r[3] then
      redis.call('HDEL', K.entered, '^keep')
    end
  else
    -- Every entry below `past` has left the line.
    local past = head and head + 0 or tonumber(redis.call('GET', K.seq) or '0') + 1
    local free, gone, deadline, most
    if r[3] then
      local f, g, d, m = r[3]:match('^(%d+),(%d+),(%d+),(%d+)$')
      if f then
        free, gone, deadline, most = f + 0, g + 0, d + 0, m + 0
      end
    end
    local changed = true
    if not free then
      free, gone, deadline, most = 0, past, now + ttl, ttl
    elseif now > deadline then
      free, gone, deadline, most = gone, past, now + math.max(most, ttl), ttl
    elseif ttl > most then
      most = ttl
    else
      changed = false
    end
    if changed then
      redis.call('HSET', K.entered, '^keep', string.format('%d,%d,%d,%d', free, gone, deadline, most))
    end
    bound = math.min(free, past)
  end
  if r[1] then
    drop_spans('^', '^lo', r[1] + 0, math.floor(bound / MARK_SPAN))
  end
  if r[2] and drop_spans('~', '~lo', r[2] + 0, math.floor(bound / OLD_SPAN)) == 0 then
    redis.call('HDEL', K.entered, '~lo')
  end
end

-- Removes a waiting user from the line and its indexes; returns their
-- sequence number and entry time, or nil if they were not in line. The
-- marks stay until the head of the line passes them (trim_marks).
-- drop_from_line(user) only removes one the caller knows is waiting.
local function drop_from_line(user)
  redis.call('ZREM', K.waiting, user)
  redis.call('HDEL', K.entered, user)
  redis.call('ZREM', K.seen, user)
end

local function unline(user)
  local seq = tonumber(redis.call('ZSCORE', K.waiting, user))
  if not seq then
    return nil
  end
  local entered = entered_at(user, seq)
  drop_from_line(user)
  return seq, entered
end

-- Marks a user the caller knows is in line as seen at `now` (adds them to
-- presence if they were not seen since they entered).
local function seen_now(user, now)
  redis.call('ZADD', KEYS[4], string.format('%d', now), user)
end

-- The entry time of `user`'s token record `tok` (token_record), or nil:
-- an admission pass writes none (-1: the marks are kept for its holders,
-- trim_marks), so it is read from the marks by the token's entry id.
local function token_entered(user, tok)
  if tok.entered and tok.entered >= 0 then
    return tok.entered
  end
  return tok.entry and entered_at(user, tok.entry)
end

-- One user's standing, token first (tok: their token record, token_get,
-- or their key of the earlier layout, to read it by):
-- {kind, created, rank, entry, token, ttl_ms, entered_at, total, pass}
-- with -1 / '' where a field does not apply; entry is the arrival sequence
-- (the line's order while waiting, kept with the token once admitted).
-- `times`: whether a holder's entry time is read where the token does not
-- carry it (token_entered); a caller that shows none passes false.
local function describe(user, tok, now, created, total, pass, times)
  if type(tok) == 'string' then
    tok = token_get(user, tok)
  end
  if tok and tok.exp > now then
    return {'ready', created, -1, tok.entry or -1, tok.token, tok.exp - now,
            (times and token_entered(user, tok) or tok.entered) or -1, total, pass}
  end
  local rank = redis.call('ZRANK', K.waiting, user)
  if rank then
    local seq = tonumber(redis.call('ZSCORE', K.waiting, user))
    return {'waiting', created, rank, seq, '', -1, entered_at(user, seq) or -1, total, pass}
  end
  return {'none', created, -1, -1, '', -1, -1, total, pass}
end

local function totals()
  return redis.call('ZCARD', K.waiting), tonumber(redis.call('GET', K.pass) or '0')
end

-- Stock (crate::queue::stock; set by stock.lua): a HASH per queue, in the
-- queue's hash tag, passed by the scripts that read it as their last KEY:
-- remaining, per (most one buyer takes), consumed (tokens used since the
-- report), soldout (1/0), reopened (ms). Absent: the queue is not linked.
-- Buyers the stock lets in beside the holders: ceil(remaining / per) less
-- the holders and the tokens used since the report, math.huge when not
-- linked; and whether the queue is sold out, read in the same HMGET
-- (stock_read: `s`, when the caller read it already). Call after
-- expire_active.
local function stock_read(key)
  return redis.call('HMGET', key, 'remaining', 'per', 'consumed', 'soldout', 'reopened')
end

local function stock_room(key, s)
  s = s or stock_read(key)
  local remaining = tonumber(s[1])
  if not remaining then
    return math.huge, false
  end
  local per = math.max(1, tonumber(s[2]) or 1)
  local room = math.ceil(remaining / per) - redis.call('ZCARD', K.active) - (tonumber(s[3]) or 0)
  return math.max(0, room), s[4] == '1'
end

local function sold_out(key)
  return redis.call('HGET', key, 'soldout') == '1'
end

-- The sold-out flag's copy, a STRING beside the stock HASH `key` ('1',
-- present while the queue is sold out), so a poll reads it with the
-- queue's other STRINGs in one MGET (status.lua) rather than in a command
-- of its own. stock.lua writes it with the flag; admit.lua sets it right
-- on its next pass should it differ (a queue sold out before the copy
-- existed: an upgrade).
local function sold_out_key(key)
  return key .. ':soldout'
end

local function copy_sold_out(key, is)
  if is then
    redis.call('SET', sold_out_key(key), '1')
  else
    redis.call('DEL', sold_out_key(key))
  end
end

-- The flags a describe() row carries: bit 0 sold out, bit 1 held by an
-- operator (the buyer is told the line is paused rather than an estimate).
local function row_flags(key)
  return (sold_out(key) and 1 or 0) + (redis.call('EXISTS', K.paused) == 1 and 2 or 0)
end

-- A describe() row with its flags appended (row_flags).
local function with_stock(row, key)
  row[#row + 1] = row_flags(key)
  return row
end

-- Whether a pass may drop absent buyers: not while sold out, nor for
-- abandon_after after a restock reopened the line (`s`: stock_read's).
local function stock_sweeps(s, now, abandon_after)
  if s[4] == '1' then
    return false
  end
  local at = tonumber(s[5])
  return not at or now - at >= abandon_after
end

-- Audit log (src/queue/audit.rs): a STREAM per queue, in the queue's hash
-- tag, passed by every script that writes it as its LAST key. AUDIT_MAXLEN
-- comes from the prelude (--audit-max-len); 0: no log, and no XADD at all.
-- Appends one entry {kind, at, [user], [entry], [pass]} (nil fields are
-- left out), trimmed to about AUDIT_MAXLEN entries (MAXLEN ~ trims whole
-- radix-tree nodes only: O(1) amortised). Called by the script that does
-- the action, inside its atomic step, so the log holds exactly what
-- happened, once.
local function audit(key, kind, now, user, entry, pass)
  if AUDIT_MAXLEN <= 0 then
    return
  end
  local f = {'kind', kind, 'at', string.format('%d', now)}
  if user then
    f[#f + 1], f[#f + 2] = 'user', user
  end
  if entry then
    f[#f + 1], f[#f + 2] = 'entry', string.format('%d', entry)
  end
  if pass then
    f[#f + 1], f[#f + 2] = 'pass', string.format('%d', pass)
  end
  redis.call('XADD', key, 'MAXLEN', '~', AUDIT_MAXLEN, '*', unpack(f))
end

-- audit() for each of `items`, all of one kind, time and pass, given as
-- entry id and user in turn ({entry, user, entry, user, ...}; neither
-- holds a space), in ONE stream entry: its fields kind, at, pass and, for
-- two or more, buyers (the items joined by spaces: "entry user entry
-- user ..."); one item is written as audit() writes it. The entry's id is
-- chosen so that the items' ids (src/store/redis/audit.rs gives the i-th
-- of n the entry's id less n - 1 - i) are those n entries written one
-- after another would have had: the entry takes the stream's next id plus
-- n - 1, and the next '*' comes after all of them. One XADD a pass, not
-- one a buyer. The next id is read from the stream's last entry (no
-- command reads the stream's last id alone; trimming never drops the
-- newest entry); should Redis refuse the id all the same, the items are
-- written one entry each.
local function audit_each(key, kind, now, items, pass)
  local n = #items / 2
  if AUDIT_MAXLEN <= 0 or n == 0 then
    return
  end
  local at, p = string.format('%d', now), string.format('%d', pass)
  local maxlen = string.format('%d', AUDIT_MAXLEN)
  if n > 1 then
    local ms, seq = now, 0
    local last = redis.call('XREVRANGE', key, '+', '-', 'COUNT', 1)[1]
    if last then
      local lms, lseq = last[1]:match('^(%d+)-(%d+)$')
      lms, lseq = lms + 0, lseq + 0
      if lms >= now then
        ms, seq = lms, lseq + 1
      end
    end
    local id = string.format('%d-%d', ms, seq + n - 1)
    local done = redis.pcall('XADD', key, 'MAXLEN', '~', maxlen, id, 'kind', kind, 'at', at,
      'pass', p, 'buyers', table.concat(items, ' '))
    if type(done) ~= 'table' then
      return
    end
  end
  for i = 1, #items, 2 do
    local entry, user = items[i], items[i + 1]
    redis.call('XADD', key, 'MAXLEN', '~', maxlen, '*', 'kind', kind, 'at', at,
      'user', user, 'entry', entry, 'pass', p)
  end
end
