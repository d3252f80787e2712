-- RedLock: a place leaves the queue of the key's first master, announced to nobody: its process
-- holds the lock now (a majority granted after that master did), and will release it.
-- KEYS[1] the queue, KEYS[2] the places' deadlines; ARGV[1] the place.
if redis.call('ZREM', KEYS[2], ARGV[1]) == 1 then
  redis.call('LREM', KEYS[1], 1, ARGV[1])
  return 1
end
return 0
