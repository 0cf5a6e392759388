"""A client's address and what it may do: which address of a proxy chain is the client's (proxies), and how
often an address may send requests (ratelimit)."""
