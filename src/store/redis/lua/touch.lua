-- touch.lua: marks waiting users as seen now (their streams are open).
-- KEYS, ARGV[1..2]: see common.lua.   ARGV[3..] users
-- Returns the number of users updated.
-- A script so the time is the store clock (TIME), the same clock admission
-- compares against; ZADD XX never re-adds a user who has left the line.
local now = now_ms()
local n = 0
local args = {}
for i = 3, #ARGV do
  args[#args + 1] = now
  args[#args + 1] = ARGV[i]
  if #args >= 1000 then
    n = n + redis.call('ZADD', K.seen, 'XX', 'CH', unpack(args))
    args = {}
  end
end
if #args > 0 then
  n = n + redis.call('ZADD', K.seen, 'XX', 'CH', unpack(args))
end
return n
