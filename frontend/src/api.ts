import type { Health } from './types'

/** A non-2xx answer from the backend; `message` is the server's `detail` when it sent one. */
export class ApiError extends Error {
  readonly status: number
  /** The `detail` field of the error body, if any. */
  readonly detail: unknown
  /** The whole parsed error body (JSON, or text when it was not JSON). */
  readonly body: unknown
  /** The Retry-After header in seconds (a 503 or 429 that says when to ask again), or null. */
  readonly retryAfterSeconds: number | null

  constructor(status: number, message: string, detail: unknown = null, body: unknown = null, retryAfterSeconds: number | null = null) {
    super(message)
    this.name = 'ApiError'
    this.status = status
    this.detail = detail
    this.body = body
    this.retryAfterSeconds = retryAfterSeconds
  }
}

/** Fired on window whenever the API answers 401 (the session ended): the app goes to sign-in. */
export const UNAUTHORIZED_EVENT = 'lanner:unauthorized'

function notifyUnauthorized() {
  if (typeof window !== 'undefined') window.dispatchEvent(new Event(UNAUTHORIZED_EVENT))
}

/** FastAPI sends `{"detail": "text"}` for HTTPException and a list of issues for 422. */
function detailMessage(detail: unknown): string | null {
  if (typeof detail === 'string') return detail
  if (Array.isArray(detail)) {
    const parts = detail.map((item: unknown) => {
      if (item && typeof item === 'object' && 'msg' in item) {
        const { msg, loc } = item as { msg: unknown; loc?: unknown }
        const where = Array.isArray(loc) ? loc.filter((p) => p !== 'body').join('.') : ''
        return where ? `${where}: ${String(msg)}` : String(msg)
      }
      return JSON.stringify(item)
    })
    return parts.length > 0 ? parts.join('; ') : null
  }
  if (detail != null) return JSON.stringify(detail)
  return null
}

/**
 * fetch() for the backend's JSON API. Paths are same-origin (`/api/...`): the backend serves
 * the app in production and Vite proxies `/api` in development.
 * Network failures and aborts propagate as fetch raises them.
 */
export async function apiFetch<T>(path: string, init: RequestInit = {}): Promise<T> {
  const headers = new Headers(init.headers)
  headers.set('Accept', 'application/json')
  if (init.body != null && typeof init.body === 'string' && !headers.has('Content-Type')) {
    headers.set('Content-Type', 'application/json')
  }
  const response = await fetch(path, { credentials: 'same-origin', ...init, headers })
  const text = await response.text()
  let body: unknown = null
  if (text) {
    try {
      body = JSON.parse(text)
    } catch {
      body = text
    }
  }
  if (!response.ok) {
    if (response.status === 401 && !path.startsWith('/api/auth/')) notifyUnauthorized()
    const detail =
      body && typeof body === 'object' && 'detail' in body ? (body as { detail: unknown }).detail : null
    const message =
      detailMessage(detail) ?? `${response.status} ${response.statusText || 'Request failed'}`.trim()
    const retryAfter = Number(response.headers.get('Retry-After'))
    throw new ApiError(response.status, message, detail, body, retryAfter > 0 ? retryAfter : null)
  }
  return body as T
}

/** GET a JSON resource. */
export function getJson<T>(path: string, signal?: AbortSignal): Promise<T> {
  return apiFetch<T>(path, { method: 'GET', signal })
}

/** POST a JSON body and read a JSON answer. */
export function postJson<T>(path: string, payload: unknown, signal?: AbortSignal): Promise<T> {
  return apiFetch<T>(path, { method: 'POST', body: JSON.stringify(payload), signal })
}

/** PUT a JSON body (a whole resource) and read a JSON answer. */
export function putJson<T>(path: string, payload: unknown): Promise<T> {
  return apiFetch<T>(path, { method: 'PUT', body: JSON.stringify(payload) })
}

function isHealth(value: unknown): value is Health {
  return !!value && typeof value === 'object' && 'status' in value && 'workers' in value
}

/** GET /api/health. A 503 that still carries a health report is a report, not a failure. */
export async function fetchHealth(signal?: AbortSignal): Promise<Health> {
  try {
    return await getJson<Health>('/api/health', signal)
  } catch (error) {
    if (error instanceof ApiError && error.status === 503 && isHealth(error.body)) return error.body
    throw error
  }
}

/** DELETE a resource; most answer 204 with no body. */
export function deleteJson<T = null>(path: string): Promise<T> {
  return apiFetch<T>(path, { method: 'DELETE' })
}

/** The validation issues of a 422, by field path ("hyperparameters.learning_rate" → message). */
export function fieldErrors(error: unknown): Record<string, string> {
  if (!(error instanceof ApiError) || !Array.isArray(error.detail)) return {}
  return issuesByField(error.detail as unknown[])
}

/** Issues in the shape of a 422's detail ({loc, msg}), by field path. */
export function issuesByField(issues: unknown[]): Record<string, string> {
  const out: Record<string, string> = {}
  for (const item of issues) {
    if (!item || typeof item !== 'object' || !('msg' in item)) continue
    const { msg, loc } = item as { msg: unknown; loc?: unknown }
    const path = Array.isArray(loc) ? loc.filter((p) => p !== 'body').join('.') : ''
    const text = String(msg).replace(/^Value error, /, '')
    out[path] = out[path] ? `${out[path]}; ${text}` : text
  }
  return out
}

export interface UploadProgress {
  loaded: number
  total: number
}

/**
 * Uploads a file as the raw request body (what POST /api/datasets expects) with XMLHttpRequest,
 * because fetch() reports no upload progress. Rejects with ApiError like apiFetch.
 */
export function uploadFile<T>(url: string, file: Blob, onProgress?: (p: UploadProgress) => void): Promise<T> {
  return new Promise<T>((resolve, reject) => {
    const xhr = new XMLHttpRequest()
    xhr.open('POST', url)
    xhr.setRequestHeader('Accept', 'application/json')
    xhr.setRequestHeader('Content-Type', 'application/octet-stream')
    xhr.upload.onprogress = (event) => {
      if (onProgress) onProgress({ loaded: event.loaded, total: event.lengthComputable ? event.total : file.size })
    }
    xhr.onerror = () => reject(new TypeError('The upload failed: the server could not be reached'))
    xhr.onload = () => {
      let body: unknown = null
      try {
        body = xhr.responseText ? JSON.parse(xhr.responseText) : null
      } catch {
        body = xhr.responseText
      }
      if (xhr.status >= 200 && xhr.status < 300) {
        resolve(body as T)
        return
      }
      if (xhr.status === 401) notifyUnauthorized()
      const detail = body && typeof body === 'object' && 'detail' in body ? (body as { detail: unknown }).detail : null
      reject(new ApiError(xhr.status, detailMessage(detail) ?? `${xhr.status} ${xhr.statusText}`, detail, body))
    }
    xhr.send(file)
  })
}

/** ws:// or wss:// URL of a same-origin WebSocket path. */
export function wsUrl(path: string): string {
  const { protocol, host } = window.location
  return `${protocol === 'https:' ? 'wss:' : 'ws:'}//${host}${path}`
}
