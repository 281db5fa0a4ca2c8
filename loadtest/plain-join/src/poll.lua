-- poll.lua: the baseline's one poll, as plain as a poll gets: the user's
-- place and the line's length, read at one instant.
-- KEYS[1] the line (ZSET user -> entry number)   ARGV[1] the user.
-- Returns {rank, waiting}, or {-1, waiting} for a user not in line.
-- Also loaded by loadtest/poll-e2e.sh's baseline server (main.rs).
local rank = redis.call('ZRANK', KEYS[1], ARGV[1])
return {rank or -1, redis.call('ZCARD', KEYS[1])}
