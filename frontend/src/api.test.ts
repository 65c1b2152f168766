import { afterEach, describe, expect, it, vi } from 'vitest'
import { ApiError, apiFetch, fetchHealth, postJson } from './api'
import { healthFixture, jsonResponse } from './test/fixtures'

function mockFetch(response: Response) {
  const fetchMock = vi.fn<typeof fetch>().mockResolvedValue(response)
  vi.stubGlobal('fetch', fetchMock)
  return fetchMock
}

afterEach(() => {
  vi.unstubAllGlobals()
})

describe('apiFetch', () => {
  it('returns the parsed JSON body on 2xx', async () => {
    mockFetch(jsonResponse({ id: 7, name: 'run' }))
    await expect(apiFetch<{ id: number; name: string }>('/api/jobs/7')).resolves.toEqual({ id: 7, name: 'run' })
  })

  it('throws ApiError carrying the server detail string', async () => {
    mockFetch(jsonResponse({ detail: 'Job 7 not found' }, 404, 'Not Found'))
    const error = await apiFetch('/api/jobs/7').catch((e: unknown) => e)
    expect(error).toBeInstanceOf(ApiError)
    expect(error).toMatchObject({ status: 404, message: 'Job 7 not found', detail: 'Job 7 not found' })
  })

  it('joins FastAPI validation errors into one message', async () => {
    mockFetch(
      jsonResponse(
        {
          detail: [
            { loc: ['body', 'learning_rate'], msg: 'Input should be greater than 0', type: 'greater_than' },
            { loc: ['body', 'epochs'], msg: 'Field required', type: 'missing' },
          ],
        },
        422,
      ),
    )
    await expect(postJson('/api/jobs', {})).rejects.toThrow(
      'learning_rate: Input should be greater than 0; epochs: Field required',
    )
  })

  it('falls back to the HTTP status when the body has no detail', async () => {
    mockFetch(new Response('<html>Bad gateway</html>', { status: 502, statusText: 'Bad Gateway' }))
    await expect(apiFetch('/api/health')).rejects.toThrow('502 Bad Gateway')
  })

  it('sends JSON with the right headers', async () => {
    const fetchMock = mockFetch(jsonResponse({ ok: true }, 201))
    await postJson('/api/jobs', { model: 'smollm2' })
    const [path, init] = fetchMock.mock.calls[0]!
    expect(path).toBe('/api/jobs')
    expect(init?.method).toBe('POST')
    expect(init?.body).toBe('{"model":"smollm2"}')
    const headers = new Headers(init?.headers)
    expect(headers.get('Content-Type')).toBe('application/json')
    expect(headers.get('Accept')).toBe('application/json')
  })
})

describe('fetchHealth', () => {
  it('reads a 503 that carries a health report as that report', async () => {
    const degraded = healthFixture({ status: 'degraded', workers: [] })
    mockFetch(jsonResponse(degraded, 503, 'Service Unavailable'))
    await expect(fetchHealth()).resolves.toEqual(degraded)
  })

  it('still throws on a 503 without a report', async () => {
    mockFetch(jsonResponse({ detail: 'starting up' }, 503))
    await expect(fetchHealth()).rejects.toThrow('starting up')
  })
})
