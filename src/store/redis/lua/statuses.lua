-- statuses.lua: many users' standings in one round trip (stream refreshes).
-- KEYS, ARGV[1..2]: see common.lua, but KEYS[9..] are the users' token keys,
-- one per user, in the order of ARGV[3..] users, then the queue's stock HASH
-- (see common.lua; its sold-out flag read from the STRING beside it,
-- sold_out_key) as the last KEY
-- Returns a list of describe()-shaped rows with the sold-out flag, one per
-- user, in argument order,
-- without the entry time (streams do not show it): a waiting user costs
-- a ZRANK (and a 500th of a ZMSCORE), so refreshing open streams stays
-- cheap per user.
-- Atomic so all rows come from one instant, with one ZCARD for all; within
-- one script a user cannot be both in line and holding a token, so reading
-- the rank first is as safe as reading the token first.
local now = now_ms()
local v = redis.call('MGET', K.pass, K.paused, sold_out_key(KEYS[#KEYS]))
local total, pass = redis.call('ZCARD', K.waiting), v[1] and v[1] + 0 or 0
local soldout = (v[3] and 1 or 0) + (v[2] and 2 or 0)
local users = {}
for i = 3, #ARGV do
  users[#users + 1] = ARGV[i]
end
-- Who waits, and with which entry id, 500 users a ZMSCORE: a waiting
-- user then costs one ZRANK.
local scores = {}
for from = 1, #users, 500 do
  local chunk = {unpack(users, from, math.min(from + 499, #users))}
  local got = redis.call('ZMSCORE', K.waiting, unpack(chunk))
  for j = 1, #chunk do
    scores[from + j - 1] = got[j]
  end
end
-- Who holds a token: the others' fields of the token HASH (common.lua),
-- 500 a HMGET; a user found in neither is asked of the earlier layout.
local rest, held = {}, {}
for i, user in ipairs(users) do
  if not scores[i] then
    rest[#rest + 1] = i
  end
end
for from = 1, #rest, 500 do
  local chunk = {}
  for j = from, math.min(from + 499, #rest) do
    chunk[#chunk + 1] = users[rest[j]]
  end
  local got = redis.call('HMGET', tokens_key(), unpack(chunk))
  for j = 1, #chunk do
    held[rest[from + j - 1]] = got[j]
  end
end
local out = {}
for i, user in ipairs(users) do
  local seq = scores[i]
  if seq then
    out[i] = {'waiting', 0, redis.call('ZRANK', K.waiting, user), seq + 0, '', -1, -1, total, pass,
              soldout}
  else
    local tok = held[i] and token_record(held[i]) or KEYS[8 + i]
    local row = describe(user, tok, now, 0, total, pass, false)
    row[#row + 1] = soldout
    out[i] = row
  end
end
return out
