"""The operations web app shared by the broker and the NameServer: the aiohttp
application factory with its guards (`app`), signed requests (`signing`:
canonical string, verifier, replay cache), the OpenAPI description
(`openapi`) and the static dashboard (`dashboard/`, with its signer sign.js).

It knows no server: each server mounts its own routes on the app it builds.
"""
