"""The running daemon process and its housekeeping: work in flight (`inflight`), SIGHUP (`reload`),
the main loop's sleep (`waker`), glibc's malloc arenas (`allocator`), the log format (`logs`) and gc of
the content store (`garbage`).
"""
