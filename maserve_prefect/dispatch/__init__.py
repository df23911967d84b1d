"""The one dispatcher: events in, an immutable snapshot to a pure plan, decisions applied.

`plans` holds the plan types and the registry (plans register themselves by name); `dispatcher`
keeps the books and applies decisions. The task runner, every replay and the pool runtime drive
the same `Dispatcher`.
"""
