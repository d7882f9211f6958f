"""Transport: name resolution and non-blocking connect.  Nothing about HTTP."""
