/* node/web_assets.h — the page's files (web/), built into the binary by
 * cmake/embed_web.cmake, so an installed gwtf needs nothing beside it. */
#ifndef GWTF_NODE_WEB_ASSETS_H
#define GWTF_NODE_WEB_ASSETS_H

#include <stddef.h>

typedef struct web_asset {
  const char *path; /* "/app.js"; index.html is also "/" */
  const char *type; /* Content-Type */
  const unsigned char *data;
  size_t len;
} web_asset;

/* The asset served at path, or NULL. */
const web_asset *web_asset_find(const char *path);

#endif
