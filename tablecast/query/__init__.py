"""The read core of a serving node, free of any transport: who is asking and what they
may read (auth, policy, rate limits), which node answers a partition (ownership), reads
of this node's own stores, forwarding to the node that owns a key, and the caches in
front of them (kept answers, the short path, batched forwards). Reads are values
(:mod:`tablecast.query.queries`): the HTTP, gRPC and watch front ends decode requests
into them, :meth:`tablecast.query.reads.Router.read` answers them, and the front ends
encode what it returns.
"""
