import { useCallback, useEffect, useRef, useState } from 'react'
import { getJson } from './api'

export interface Resource<T> {
  data: T | null
  error: string | null
  loading: boolean
  /** Fetch again; the old data stays on screen meanwhile. */
  reload: () => Promise<void>
}

/** GET a JSON resource when `path` changes (null: nothing to load yet). */
export function useResource<T>(path: string | null): Resource<T> {
  const [data, setData] = useState<T | null>(null)
  const [error, setError] = useState<string | null>(null)
  const [loading, setLoading] = useState(path != null)
  const current = useRef(path)
  current.current = path

  const reload = useCallback(async () => {
    const asked = current.current
    if (asked == null) return
    setLoading(true)
    try {
      const value = await getJson<T>(asked)
      if (current.current === asked) {
        setData(value)
        setError(null)
      }
    } catch (err) {
      if (current.current === asked) {
        setError(err instanceof TypeError ? `The server could not be reached (${err.message})` : err instanceof Error ? err.message : String(err))
      }
    } finally {
      if (current.current === asked) setLoading(false)
    }
  }, [])

  useEffect(() => {
    setData(null)
    setError(null)
    void reload()
  }, [path, reload])

  return { data, error, loading, reload }
}
