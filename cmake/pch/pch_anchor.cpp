// Anchor translation unit of the shared precompiled header.
