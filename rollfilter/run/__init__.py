"""One run put together: its parts built from a Config, its transport, and what comes before and after."""
