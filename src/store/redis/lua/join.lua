-- join.lua: a helper prepended (after gcra.lua) to the scripts that put
-- users in line, enter.lua (one join) and enter_many.lua (a group of
-- joins, group commit); not a script on its own.
--
-- join(g, tokkey, budget_key, joins_key, places_key, user, fast_token, c,
-- probed, score): one join, with
--   g    = the call's shared state, from group(now, stock key, audit key,
--          lottery key, pre-queue key) (the lottery's keys: see
--          lottery_schedule.lua; a call without them knows no lottery):
--          the audit STREAM gets an 'admitted' entry per fast track; the store
--          time; the queue's stock HASH (see common.lua: no fast track past
--          it, and every row says whether the queue is sold out, read once
--          per call: no join changes the stock); what the joins of one
--          call would otherwise each read again (line length, pass
--          counter, entry counter, the span last marked), kept current by
--          each join; and the new places' writes to the line, presence and
--          the counter, deferred to flush(g)
--   the user's token key and request budget, the client address's join
--   rate and places (STRING budget and join rate, see gcra.lua; places:
--   ZSET user -> entry id; the address keys may be nil when the address
--   has no limits), the user and the fast-track token
--   c    = the arguments every join of a call shares, parsed once per call
--          by join_config(packed) from ONE argument: 11 numbers separated
--          by single spaces, in order: budget period ms (0: none), budget
--          burst, grace ms, first entry id (used only if the entry counter
--          does not exist yet), token TTL ms, batch, interval ms, max
--          active (-1 = unlimited), address join period ms (0: none),
--          address join burst, places per address (0: none). One string
--          rather than 11 arguments: Redis makes a Lua string and a table
--          slot of every argument on every call (about 0.1 us each here),
--          and a lean head reads at most the first four (join_head).
--          enter.lua's may end in '|entry,ms|' (a known entry time,
--          enter.lua), which join_config does not read.
--          The address's limits are on exactly when the caller sends the
--          address's keys (the Rust side decides from the same numbers).
--   probed, score: probed is true when the caller read, at the start of
--          the call and for the whole group at once (enter_many.lua), that
--          no user of the group holds a token (the queue's token HASH and
--          their keys of the earlier layout), and read the user's score in
--          the line (score, false if not in line). Only this user's own
--          joins change those two, so they hold for the user's first join
--          of the call; a later join of the same user in the call reads
--          them again. Not probed: read here (enter.lua).
-- Returns describe(): {kind, created, rank, entry, token, ttl_ms, entered_at, total, pass, soldout},
-- or limited(<'buyer'|'address_places'|'address_joins'>, ms to wait), changing nothing,
-- or, for a new place in line, nil and its rank, entry id and entry time
-- (waiting_row(g, ...) makes its describe() row; enter_many.lua sends
-- most of them as two numbers instead),
-- or {'prequeue', 0, -1, -1, '', -1, -1, 0, 0} (no sold-out flag) for a user
-- without a place while a lottery is scheduled and not drawn, changing
-- nothing: the caller pre-joins them (lottery_join.lua). Deciding here, in
-- the join's own step, leaves no window in which a join that an instance
-- took for an open queue lands in line ahead of the pre-queue.
-- A new entry (in line or on the fast track) takes the next entry id; so
-- does a token issued by a version without entry ids, on its holder's next
-- join, so they can be given a ticket for it (rolling upgrades).
-- Must run inside one script because the check and the add must be one step (two
-- concurrent first enters of one user must not both add), the arrival
-- number must be taken in the same step as the add (strict FIFO), the fast
-- track must spend from the shared budget in the same step as it issues the
-- token (a burst cannot bypass the rate or maxActive), and an address's
-- count must be checked and raised with the add (two instances at an
-- address's last place must not both add). No fast track while paused.

-- Whether a fence holding `last` (its value, or false when it has none)
-- is past the call `number`: compared as the digits they are (no
-- leading zeros), not converted.
local function fence_passed(last, number)
  return last and (#last > #number or #last == #number and last > number)
end

-- The joins of one grouping task (batch.rs) reach Redis in the order it
-- made them, several calls may be in flight, and a call sent again (a
-- retry after a lost connection, a reloaded script cache) may arrive
-- behind a later one. `fence` (a STRING of the task's own) holds the
-- number of the task's last call run: sets it to `number` and returns
-- false, or returns true, changing nothing, when it holds a later one
-- (the caller then refuses the call: its joins fail rather than take
-- places behind later arrivals). Expires 60 s after the task's last call
-- that wrote it: 30 times a call's response timeout. A call that no
-- earlier one of its task can still follow (batch.rs: none in flight as
-- it is sent, none failed lately) only reads the fence (fence_passed):
-- an earlier call that might yet run after it is refused by the next
-- call written behind it.
local function overtaken(fence, number)
  local last = redis.call('SET', fence, number, 'PX', '60000', 'GET')
  if fence_passed(last, number) then
    redis.call('SET', fence, last, 'PX', '60000')
    return true
  end
  return false
end

-- The first four numbers of a join's packed arguments (join_config):
-- budget period, budget burst, grace, and the first entry id as sent, for
-- a lean head (one anchored match, no table).
local function join_head(packed)
  local bp, bb, grace, first = packed:match('^(%d+) (%d+) (%d+) (%d+)')
  return bp + 0, bb + 0, grace + 0, first
end

local function join_config(packed)
  local bp, bb, grace, first, ttl, batch, interval, max_active, jp, jb, places = packed:match(
    '^(%d+) (%d+) (%d+) (%d+) (%d+) (%d+) (%d+) (%-?%d+) (%d+) (%d+) (%d+)')
  return {
    ttl = ttl + 0, batch = batch + 0, interval = interval + 0,
    max_active = max_active + 0, first = first,
    budget_period = bp + 0, budget_burst = bb + 0,
    grace = grace + 0, join_period = jp + 0,
    join_burst = jb + 0, max_places = places + 0,
  }
end

local function group(now, stock, audit_key, lot, pre)
  return {
    now = now, stock = stock, audit = audit_key, lot = lot, pre = pre,
    -- users: every user joined in the call, true, or the flush number
    -- (gen) of a new place not yet written (flush(g) writes it)
    line = {}, users = {}, lines = 0, gen = 1,
  }
end

-- What the caller learnt from one EXISTS of the lottery and stock keys
-- (with the token keys it probes): neither exists, the common case, so
-- the call reads neither (no pre-queue, nothing sold out, no stock room
-- to count).
local function group_neither(g)
  g.pre_queue, g.no_stock = false, true
end

-- True while a lottery of the queue is scheduled and not drawn (its draw
-- may be staged: 'drawing'): a join without a place then belongs in the
-- pre-queue (lottery_join.lua), not in line. Read once per call: no join
-- changes it.
local function group_pre_queue(g)
  if g.pre_queue == nil then
    local state = g.lot ~= nil and redis.call('HGET', g.lot, 'state')
    g.pre_queue = state == 'scheduled' or state == 'drawing'
  end
  return g.pre_queue
end

-- What the MGET of group_read (its first four keys) says, kept in g.
local function group_known(g, v)
  g.pass, g.held = tonumber(v[1] or '0'), v[3] and 2 or 0
  if not g.last then
    g.seq_read = v[2]
  end
  if g.mark == nil then
    g.mark = v[4]
  end
end

-- The queue's STRINGs a call reads, in one MGET, once per call: the pass
-- counter, the entry counter (group_entry needs it, unless it already
-- read it: then the call's own count stands), whether an operator holds
-- admission (g.held, a row's flag bit 1), the last mark (g.mark, see
-- mark_entry in common.lua) and, with `budget_key`, that buyer's budget
-- (g.budget, for join's repeat check: gcra_stored).
local function group_read(g, budget_key)
  local v
  if budget_key then
    v = redis.call('MGET', K.pass, K.seq, K.paused, last_mark_key(), budget_key)
    g.budget_key, g.budget = budget_key, v[5]
  else
    v = redis.call('MGET', K.pass, K.seq, K.paused, last_mark_key())
  end
  group_known(g, v)
end

-- The line's length and the pass counter, read once per call: within a
-- call only a join's own add changes them (join keeps g.total current).
local function group_totals(g)
  if not g.total then
    if g.pass == nil then
      group_read(g)
    end
    g.total = redis.call('ZCARD', K.waiting)
  end
  return g.total, g.pass
end

-- Whether an operator holds admission (no fast track while held).
local function group_held(g)
  if g.held == nil then
    g.held = redis.call('EXISTS', K.paused) == 1 and 2 or 0
  end
  return g.held
end

-- The next entry id, counted in the call and stored by flush(g): the
-- counter is read once per call (a counter not yet made counts from
-- `first`, as next_entry in common.lua does).
local function group_entry(g, first)
  if not g.last then
    local stored = g.seq_read
    if stored == nil then
      stored = redis.call('GET', K.seq)
    end
    g.last = tonumber(stored or first)
  end
  g.last = g.last + 1
  g.dirty = true
  return g.last
end

-- Whether the active set has room for a fast track (room(), common.lua).
-- Only the fast track reads the active set (and stock_room, after this),
-- so its expired holders are dropped here, once per call, rather than by
-- every call: a burst joins behind a line and never asks.
local function group_room(g, max_active)
  if not g.expired then
    expire_active(g.now)
    g.expired = true
  end
  return room(max_active) > 0
end

-- row with the sold-out flag appended (with_stock), the flag read once
-- per call.
local function group_sold(g)
  if g.sold == nil then
    -- Bit 0 sold out, bit 1 held (see with_stock, common.lua).
    g.sold = (not g.no_stock and sold_out(g.stock) and 1 or 0) + group_held(g)
  end
  return g.sold
end

local function group_stock(g, row)
  row[#row + 1] = group_sold(g)
  return row
end

-- The describe() row of a new place in line (join's nil, rank, seq,
-- entered): nobody holds a token under a new place's user, and the line
-- is one longer than its rank.
local function waiting_row(g, rank, seq, entered)
  return group_stock(g, {'waiting', 1, rank, seq, '', -1, entered, rank + 1, g.pass})
end

-- Counts a new place (entry id `entry`) against the client address.
local function count_place(places_key, max_places, entry, user)
  if max_places > 0 then
    redis.call('ZADD', places_key, entry, user)
    -- Kept a day past the address's last new place; ended places are
    -- forgotten when the count reaches the limit.
    redis.call('PEXPIRE', places_key, 86400000)
  end
end

-- Writes what the call's new places deferred: the entry counter, and one
-- ZADD for the line. Called before anything reads them (a repeat join, an
-- address's places) and at the end of the call. A new place writes no
-- presence: it counts as seen at its entry time (see seen_now in
-- common.lua and the sweep in admit.lua) until the buyer is seen again.
local function flush(g)
  if g.dirty then
    if g.mark_dirty then
      redis.call('MSET', K.seq, string.format('%d', g.last), last_mark_key(), g.mark)
      g.mark_dirty = false
    else
      redis.call('SET', K.seq, string.format('%d', g.last))
    end
    g.dirty = false
  end
  if g.lines > 0 then
    redis.call('ZADD', K.waiting, unpack(g.line))
    g.line, g.lines, g.gen = {}, 0, g.gen + 1
  end
end

-- A new place in line for `user` (no place, no token, not refused), the
-- line `total` long before it: takes the next entry id, defers the line's
-- write to flush(g), marks the entry's time (which is also its presence
-- until the buyer is seen again: no presence write) and counts the
-- place against the address (places_key nil: the address has no limits).
-- Returns the place's rank, entry id and entry time. join() ends here for
-- a new place; enter_many.lua comes here directly for a join it knows is
-- a new buyer's (probed, not in line, not seen earlier in the call, no
-- address limits, no pre-queue, a line that is not empty: nothing else
-- in join() applies to it).
local function new_place(g, c, user, places_key, total)
  local seq = group_entry(g, c.first)
  local n = g.lines
  -- The score as a string made here: a number passed to redis.call is
  -- printed as a float (%.17g), several times dearer than '%d'.
  g.line[n + 1], g.line[n + 2] = string.format('%d', seq), user
  g.lines = n + 2
  g.users[user] = g.gen
  -- Every join of a call has the same time: once a span is marked, the
  -- call's later entries in it are covered by that mark (compared as the
  -- span's number: no string per join).
  local span = math.floor(seq / MARK_SPAN)
  if g.marked ~= span then
    local mark
    g.entered, mark = mark_entry(seq, g.now, g.mark)
    if mark then
      g.mark, g.mark_dirty = mark, true
    end
    g.marked = span
  end
  count_place(places_key, c.max_places, seq, user)
  g.total = total + 1
  -- Entry ids only grow, so the new place is the last: its rank is the
  -- line's length before it.
  return total, seq, g.entered
end

local function join(g, tokkey, budget_key, joins_key, places_key, user, fast_token, c, probed, score)
  local now, first = g.now, c.first
  local budget_period = c.budget_period
  local max_places = c.max_places

  local before = g.users[user]
  if before then
    probed = false -- the same buyer again in this call: read it as stored
    if before == g.gen then
      flush(g)
    end
  end
  g.users[user] = true
  local tok, waiting, entered
  if probed then
    waiting = score and tonumber(score)
  else
    -- The line first: a buyer in line holds no token.
    waiting = tonumber(redis.call('ZSCORE', K.waiting, user))
    tok = not waiting and token_get(user, tokkey)
  end
  if tok or waiting then
    flush(g) -- describe() reads the line as stored
    if budget_period > 0 then
      -- A repeat join: counted once its entry is older than the grace.
      if tok then
        entered = token_entered(user, tok)
      else
        entered = entered_at(user, waiting)
      end
      if not entered or now - entered >= c.grace then
        local wait
        if g.budget_key == budget_key then
          -- Read with the call's STRINGs (group_read); spent once.
          g.budget_key = nil
          wait = gcra_stored(budget_key, g.budget, now, budget_period, c.budget_burst)
        else
          wait = gcra(budget_key, now, budget_period, c.budget_burst)
        end
        if wait > 0 then
          return limited('buyer', wait)
        end
      end
    end
    if tok and not tok.entry then
      -- A token of a version without entry ids (earlier layout only).
      tok.entry = group_entry(g, first)
      tok.entry_s = nil
      token_put(user, tok)
    end
    local total, pass = group_totals(g)
    if waiting then
      seen_now(user, now)
      -- describe() for a buyer known to wait and to hold no token: the
      -- line's rank, and the entry id and time already read.
      if not entered then
        entered = entered_at(user, waiting)
      end
      return group_stock(g, {'waiting', 0, redis.call('ZRANK', K.waiting, user), waiting, '',
        -1, entered or -1, total, pass})
    end
    return group_stock(g, describe(user, tok, now, 0, total, pass, true))
  end

  -- No place, and a lottery waits to be drawn: the caller puts the user in
  -- its pre-queue (where the address's limits are checked), not in line.
  if group_pre_queue(g) then
    return {'prequeue', 0, -1, -1, '', -1, -1, 0, 0}
  end

  -- A new place: the client address's limits first (gcra.lua). The
  -- liveness scan reads the line, so the group's deferred writes go first.
  if max_places > 0 or c.join_period > 0 then
    local refused = address_limits(g.pre, places_key, joins_key, now, max_places,
      c.join_period, c.join_burst, flush, g)
    if refused then
      return refused
    end
  end

  local total, pass = group_totals(g)
  if total == 0 and group_room(g, c.max_active) and group_held(g) == 0
      and (g.no_stock or stock_room(g.stock) > 0) then
    local level, at = refill(c.batch, c.interval, now)
    if level >= 1 then
      save_bucket(level - 1, at)
      local entry = group_entry(g, first)
      local exp = issue(user, fast_token, now, c.ttl, now, entry)
      audit(g.audit, 'admitted', now, user, entry)
      -- Every instance counts admissions from the queue's events (the
      -- console's admitted per minute): a fast track is one too.
      publish(string.format('{"kind":"fastTracked","at":%d}', now))
      count_place(places_key, max_places, entry, user)
      return group_stock(g, {'ready', 1, -1, entry, fast_token, exp - now, now, total, pass})
    end
  end

  return nil, new_place(g, c, user, places_key, total)
end
