"""Benchmark suites: suite files (`suite`), running one (`runner`), serving them on schedules (`serve`)."""
