-- statuses.lua: many users' standings in one round trip (stream refreshes).
-- KEYS, ARGV[1..2]: see common.lua, but KEYS[9..] are the users' token keys,
-- one per user, in the order of ARGV[3..] users, then the queue's stock HASH
-- (see common.lua) as the last KEY
-- Returns a list of describe()-shaped rows with the sold-out flag, one per
-- user, in argument order,
-- without the entry time (streams do not show it): a waiting user costs
-- ZRANK + ZSCORE, so refreshing open streams stays cheap per user.
-- Atomic so all rows come from one instant, with one ZCARD for all; within
-- one script a user cannot be both in line and holding a token, so reading
-- the rank first is as safe as reading the token first.
local now = now_ms()
local total, pass = totals()
local soldout = row_flags(KEYS[#KEYS])
local out = {}
for i = 3, #ARGV do
  local user = ARGV[i]
  local rank = redis.call('ZRANK', K.waiting, user)
  if rank then
    out[#out + 1] = {'waiting', 0, rank, tonumber(redis.call('ZSCORE', K.waiting, user)), '', -1, -1, total, pass,
                     soldout}
  else
    local row = describe(user, KEYS[i + 6], now, 0, total, pass)
    row[#row + 1] = soldout
    out[#out + 1] = row
  end
end
return out
