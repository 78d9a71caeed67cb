import { defineConfig } from "vite";

// The dev server proxies the API to a running `deepspan ui RUN`.
export default defineConfig({
  build: { outDir: "dist", emptyOutDir: true, sourcemap: false, chunkSizeWarningLimit: 400 },
  server: { proxy: { "/api": "http://127.0.0.1:7878" } },
});
