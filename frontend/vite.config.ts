import react from '@vitejs/plugin-react'
import { defineConfig } from 'vitest/config'

// The backend (FastAPI, port 8000) serves the built files from dist/ in production;
// in development Vite serves the app and forwards API and WebSocket traffic to it.
const backend = 'http://127.0.0.1:8000'

export default defineConfig({
  base: '/',
  plugins: [react()],
  build: {
    outDir: 'dist',
    emptyOutDir: true,
    sourcemap: true,
  },
  server: {
    proxy: {
      '/api': { target: backend, changeOrigin: true },
      '/ws': { target: backend, changeOrigin: true, ws: true },
    },
  },
  test: {
    environment: 'jsdom',
    setupFiles: ['./src/test/setup.ts'],
    include: ['src/**/*.test.{ts,tsx}'],
    restoreMocks: true,
    // Generous for a loaded 2-core box (jsdom renders slowly there); a passing test takes ~1 s.
    testTimeout: 30_000,
  },
})
