"""The operations web app shared by the broker and the NameServer: the aiohttp
application factory with its guards (`app`), the OpenAPI description
(`openapi`) and the static dashboard (`dashboard/`).

It knows no server: each server mounts its own routes on the app it builds.
"""
