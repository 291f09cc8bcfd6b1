"""The people who steer the broker: `directory.py` (who a token or a session names: the
administrator of `server.admin_token` and the maintainers file, re-read when it changes;
`watched.py` re-reads any such file), `rights.py` (where GitHub makes a person a maintainer,
read with their own token at sign-in or per repository with the broker's, cached in Redis).
Signing in with GitHub is the dashboard's (ui/github_signin.py); refusals are audited by
`steering/authority.py` `record_refusal`."""
