-- RedLock (after ../redis/wake_head.lua): wakes the waiting process whose place is first in the
-- queue of the key's first master, on that place's channel, sent by a releasing client once its
-- release round has answered: a waiter woken by the first master's own release could ask before
-- the other masters of the majority had let the key go, be refused, and sleep until its poll.
-- KEYS[1] the queue; ARGV[1] PUBLISH or SPUBLISH.
-- Returns 1 when a place was woken, 0 when none waits, 2 when the server refused the notification.
return wake_head(KEYS[1], ARGV[1])
