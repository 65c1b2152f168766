import { useCallback, useEffect, useRef, useState } from 'react'
import { wsUrl } from '../api'
import type { PlaygroundRequest, ServerMessage } from './types'

export type SocketState = 'connecting' | 'open' | 'closed'

/**
 * The /ws/playground connection: opened on mount, opened again on the next send after it closed.
 * Each server message goes to `onMessage`; `send` waits for the socket to open.
 */
export function usePlaygroundSocket(onMessage: (message: ServerMessage) => void) {
  const socket = useRef<WebSocket | null>(null)
  const handler = useRef(onMessage)
  handler.current = onMessage
  const [state, setState] = useState<SocketState>('connecting')
  const [closeReason, setCloseReason] = useState<string | null>(null)

  const connect = useCallback((): WebSocket => {
    const current = socket.current
    if (current && (current.readyState === WebSocket.OPEN || current.readyState === WebSocket.CONNECTING)) {
      return current
    }
    const ws = new WebSocket(wsUrl('/ws/playground'))
    socket.current = ws
    setState('connecting')
    ws.onopen = () => {
      setState('open')
      setCloseReason(null)
    }
    ws.onmessage = (event) => {
      try {
        handler.current(JSON.parse(String(event.data)) as ServerMessage)
      } catch {
        // not JSON: nothing the page can show
      }
    }
    ws.onclose = (event) => {
      if (socket.current !== ws) return
      setState('closed')
      if (event.code === 4401) setCloseReason('Your session ended: sign in again.')
      else if (event.code !== 1000) setCloseReason('The connection to the server was lost; sending reconnects.')
    }
    return ws
  }, [])

  useEffect(() => {
    connect()
    return () => {
      const ws = socket.current
      socket.current = null
      ws?.close(1000)
    }
  }, [connect])

  const send = useCallback(
    (payload: PlaygroundRequest) => {
      const ws = connect()
      const text = JSON.stringify(payload)
      if (ws.readyState === WebSocket.OPEN) ws.send(text)
      else ws.addEventListener('open', () => ws.send(text), { once: true })
    },
    [connect],
  )

  return { state, closeReason, send }
}
