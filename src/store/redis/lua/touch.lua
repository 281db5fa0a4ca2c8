-- touch.lua: marks waiting users as seen now (their streams are open, or
-- their polls found them in line since the last write: crate::push).
-- KEYS, ARGV[1..2]: see common.lua.   ARGV[3..] users
-- Returns the number of users updated.
-- A script so the time is the store clock (TIME), the same clock admission
-- compares against, and so a user is added to presence only while in line
-- (read in the same step): a user who left the line is never re-added.
-- A new place writes no presence (join.lua), so the first touch after a
-- join adds the user; later ones update them.
-- The time as a string made once: a number passed to redis.call is
-- printed as a float (%.17g) for every user.
local now = string.format('%d', now_ms())
local n = 0
local function mark(users)
  local in_line = redis.call('ZMSCORE', K.waiting, unpack(users))
  local args = {}
  for i, user in ipairs(users) do
    if in_line[i] then
      args[#args + 1] = now
      args[#args + 1] = user
    end
  end
  if #args > 0 then
    n = n + redis.call('ZADD', K.seen, 'CH', unpack(args))
  end
end
local users = {}
for i = 3, #ARGV do
  users[#users + 1] = ARGV[i]
  if #users >= 500 then
    mark(users)
    users = {}
  end
end
if #users > 0 then
  mark(users)
end
return n
