"""A session's life in the proxy: who it is (identity.py), which conversation it carries
(conversation.py), and the live sessions with their index (book.py)."""
