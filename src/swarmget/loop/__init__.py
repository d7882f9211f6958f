"""The event loop: file descriptors, timers and wake-ups; nothing about HTTP."""

from swarmget.loop.core import EVENT_READ, EVENT_WRITE, EventLoop, IOHandler, Timer

__all__ = ["EVENT_READ", "EVENT_WRITE", "EventLoop", "IOHandler", "Timer"]
