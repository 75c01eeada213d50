"""The run machinery: one run of ToC over a question set (pipeline), what it loads (resources), how the
trees are driven (scheduler, cluster), and what it writes and reads back (rundir, records, search_cache)."""
