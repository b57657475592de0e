"""Credentials of the test servers, for tests that check they never reach a message."""

# The password of the `capture` user on the `auth_mongod` fixture's server.
SECRET = "s3cr3t-Pa55-w0rd"
