"""Task data written for jaxagent: SQL scripts (sql/*.sql), SQL questions with gold queries
(sql_tasks.py) and coding problems with unit tests and reference solutions (code_tasks.py)."""
