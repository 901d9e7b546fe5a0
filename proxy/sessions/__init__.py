"""A session's life in the proxy: who it is (identity.py), which conversation it carries
(conversation.py), the live sessions with their index (book.py), and which session a call
belongs to (resolve.py)."""
